"""The RL settings of one run, typed and read once from the config's `rl` section (with the data
set's `rl_by_dataset` entry and the method's own `rl` laid over it: grid.method_rl). Every key is
required here: the defaults live in config/default.yaml alone, so a missing key is an error that
names it, never a silent fallback."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meml.core.io import DataError
from meml.training.rollout import Sampling


@dataclass(frozen=True)
class BufferSettings:
    capacity: int  # B: a flush (an SFT update) when this many hard examples are held
    threshold: float  # K/G: an expert failing more than this share of its rollouts offers the question
    insert_prob: float  # the chance an offered question goes in
    solution: str  # ground_truth | expert_trajectory: what the SFT update learns
    update: str  # joint (lambda_sft * L_SFT joins the RL loss) | separate (its own step at sft_lr)
    sft_lr: float


@dataclass(frozen=True)
class VLLMSettings:
    """`rl.vllm`, read once: vLLM's settings for RL rollouts and for evaluation."""

    gpu_memory_utilization: float  # GPU: vLLM's share of the GPU's memory beside the trained policy
    max_model_len: int | None  # the longest prompt + completion vLLM plans for; None: the model's own
    cpu_kv_cache_gib: float  # CPU: the KV cache's size (on a CPU vLLM would otherwise ask for a share of all RAM)
    enforce_eager: bool | None  # None: eager on a CPU (starts in seconds), compiled with CUDA graphs on a GPU

    @classmethod
    def from_config(cls, section: dict[str, Any]) -> VLLMSettings:
        for key in ("gpu_memory_utilization", "max_model_len", "cpu_kv_cache_gib", "enforce_eager"):
            if key not in section:
                raise DataError(f"missing vLLM setting rl.vllm.{key} (config/default.yaml has every key)")
        eager = section["enforce_eager"]
        return cls(
            float(section["gpu_memory_utilization"]),
            None if section["max_model_len"] is None else int(section["max_model_len"]),
            float(section["cpu_kv_cache_gib"]),
            None if eager is None else bool(eager),
        )

    def llm_kwargs(self, device: str) -> dict[str, Any]:
        """The arguments of vllm.LLM that depend on the device."""
        eager = (device == "cpu") if self.enforce_eager is None else self.enforce_eager
        out: dict[str, Any] = {"enforce_eager": eager}
        if self.max_model_len is not None:
            out["max_model_len"] = self.max_model_len
        if device == "cpu":
            out["kv_cache_memory_bytes"] = int(self.cpu_kv_cache_gib * 2**30)
        else:
            out["gpu_memory_utilization"] = self.gpu_memory_utilization
        return out


@dataclass(frozen=True)
class RLSettings:
    steps: int
    epochs: float | None  # passes over the training questions; None: `steps`
    questions_per_step: int  # Q
    group_size: int  # G rollouts per question, spread over the experts
    spread: str  # split: G shared among the experts; per_expert: G each
    lr: float
    warmup_steps: int
    updates_per_batch: int
    clip_eps: float
    beta: float  # KL to the reference model (0: none loaded)
    max_grad_norm: float
    max_new_tokens: int
    max_truncated_share: float
    temperature: float
    top_p: float
    lambda_iml: float
    lambda_sft: float
    checkpoint_every: int
    keep_checkpoints: bool  # False: the last checkpoint goes once DONE is written
    rollout_batch_size: int
    engine: str
    buffer: BufferSettings
    vllm: VLLMSettings  # rl.vllm: the vLLM engine's settings (read here too: no raw dict past this type)

    @classmethod
    def from_config(cls, rl: dict[str, Any]) -> RLSettings:
        def get(section: dict[str, Any], key: str, kind: type, where: str = "rl") -> Any:
            if key not in section:
                raise DataError(f"missing RL setting {where}.{key} (config/default.yaml has every key)")
            value = section[key]
            return None if value is None else kind(value)

        buffer = rl.get("buffer")
        if not isinstance(buffer, dict):
            raise DataError("missing RL setting rl.buffer (config/default.yaml has every key)")
        return cls(
            steps=get(rl, "steps", int),
            epochs=get(rl, "epochs", float),
            questions_per_step=get(rl, "questions_per_step", int),
            group_size=get(rl, "group_size", int),
            spread=get(rl, "spread", str),
            lr=get(rl, "lr", float),
            warmup_steps=get(rl, "warmup_steps", int),
            updates_per_batch=get(rl, "updates_per_batch", int),
            clip_eps=get(rl, "clip_eps", float),
            beta=get(rl, "beta", float),
            max_grad_norm=get(rl, "max_grad_norm", float),
            max_new_tokens=get(rl, "max_new_tokens", int),
            max_truncated_share=get(rl, "max_truncated_share", float),
            temperature=get(rl, "temperature", float),
            top_p=get(rl, "top_p", float),
            lambda_iml=get(rl, "lambda_iml", float),
            lambda_sft=get(rl, "lambda_sft", float),
            checkpoint_every=get(rl, "checkpoint_every", int),
            # absent from a job's config when true (the default): cli_config leaves it out, so that
            # the key's arrival reran no finished cell
            keep_checkpoints=bool(rl.get("keep_checkpoints", True)),
            rollout_batch_size=get(rl, "rollout_batch_size", int),
            engine=get(rl, "engine", str),
            vllm=VLLMSettings.from_config(rl.get("vllm") or {}),
            buffer=BufferSettings(
                capacity=get(buffer, "capacity", int, "rl.buffer"),
                threshold=get(buffer, "threshold", float, "rl.buffer"),
                insert_prob=get(buffer, "insert_prob", float, "rl.buffer"),
                solution=get(buffer, "solution", str, "rl.buffer"),
                update=get(buffer, "update", str, "rl.buffer"),
                sft_lr=get(buffer, "sft_lr", float, "rl.buffer"),
            ),
        )

    @property
    def sampling(self) -> Sampling:
        """How rollouts are sampled: the one place a run's Sampling is built from the config."""
        return Sampling(self.max_new_tokens, self.temperature, self.top_p)


def sampling_of(cfg: dict[str, Any], dataset: str) -> Sampling:
    """RL's sampling on a data set (rl with its rl_by_dataset entry): what the calibration gate and
    the complementarity analysis sample with."""
    return RLSettings.from_config(deep_rl(cfg, dataset)).sampling


def rollouts_per_expert(group_size: int, n_experts: int, spread: str, method: str = "<method>") -> list[int]:
    """`split`: G shared, the first experts get one more (8 over 3 -> 3/3/2); `per_expert`: G each.
    A split that leaves an expert one rollout is refused: a subgroup of one always has advantage 0,
    so that expert would get no GRPO gradient at all (8 over 5 experts is 2/2/2/1/1)."""
    if spread == "per_expert":
        counts = [group_size] * n_experts
    elif spread == "split":
        counts = [group_size // n_experts + (1 if i < group_size % n_experts else 0) for i in range(n_experts)]
    else:
        raise DataError(f"unknown rollout spread '{spread}'; known: split, per_expert", None, None, "rl.spread")
    if min(counts) < 2:
        raise DataError(
            f"rl.group_size {group_size} split among {n_experts} experts gives rollouts {counts}: an expert with "
            f"fewer than 2 rollouts never gets an advantage; raise rl.group_size to {2 * n_experts} or more, "
            f"set rl.spread: per_expert, or use fewer methods.{method}.rl_experts",
            None,
            None,
            "rl.group_size",
        )
    return counts


def deep_rl(cfg: dict[str, Any], dataset: str | None) -> dict[str, Any]:
    """`rl` with the data set's `rl_by_dataset` entry laid over it (every method's starting point)."""
    from meml.core.config import deep_merge

    return deep_merge(cfg["rl"], ((cfg.get("rl_by_dataset") or {}).get(dataset) or {}) if dataset else {})


def method_rl(cfg: dict[str, Any], method: str, dataset: str | None = None) -> dict[str, Any]:
    """The RL settings a method runs with on a data set: `rl`, then the data set's `rl_by_dataset`
    entry, then the method's own `rl` overrides, each laid over the one before."""
    from meml.core.config import deep_merge

    return deep_merge(deep_rl(cfg, dataset), cfg["methods"][method].get("rl") or {})
