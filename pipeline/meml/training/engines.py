"""Which rollout engine a run uses (`rl.engine`): kv (the default: the CPU sampling engine,
kv_decode.py), hf (transformers' generate), hf-copy, or vllm; and which engine the sampling jobs
(calibration, complementarity) use, on the job's device (`sampling_job_engine`):

    device cuda, rl.engine vllm    vLLM on the GPU (rollout_vllm.VLLMEngine: the RL rollouts' engine)
    device cuda, any other engine  the model on the GPU, transformers' generate
    device cpu                     the model on the CPU, the kv engine (transformers' generate for a
                                   model it does not support), whatever rl.engine says
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from meml.core.io import DataError
from meml.core.precision import Precision
from meml.training.kv_decode import KVEngine, UnsupportedModel
from meml.training.rollout import HFCopyEngine, HFEngine, RolloutEngine
from meml.training.rollout_vllm import VLLMSettings

ENGINES = ("kv", "hf", "hf-copy", "vllm")


def make_engine(
    name: str,
    policy: Any,
    model_dir: str | Path,
    tokenizer: Any,
    batch: int,
    vllm: VLLMSettings,
    precision: Precision,
    seed: int,
    rank: int = 0,
) -> RolloutEngine:
    """`batch`: rl.rollout_batch_size, the sequences one call decodes at once; `vllm`: rl.vllm."""
    if name == "kv":
        try:
            return KVEngine(policy, tokenizer, batch, precision)
        except UnsupportedModel as err:
            raise DataError(str(err), None, None, "rl.engine") from None
    if name == "hf":
        return HFEngine(policy, tokenizer, batch, precision)
    if name == "hf-copy":
        return HFCopyEngine(policy, tokenizer, batch, precision)
    if name == "vllm":
        from meml.training.rollout_vllm import VLLMEngine

        return VLLMEngine(model_dir, tokenizer, precision, vllm, seed + rank)
    raise DataError(f"unknown rollout engine '{name}'; known: {', '.join(ENGINES)}", None, None, "rl.engine")


def sampling_engine(model: Any, tokenizer: Any, batch_size: int = 64, precision: Precision | None = None) -> Any:
    """The engine a sampling job uses: the kv engine for a supported model on a CPU, else transformers' generate."""
    if next(model.parameters()).device.type == "cpu":
        try:
            return KVEngine(model, tokenizer, batch_size, precision)
        except UnsupportedModel:
            pass
    return HFEngine(model, tokenizer, batch_size, precision)


def sampling_job_engine_name(device: str, rl_engine: str) -> str:
    """The engine a sampling job uses on `device` (the module's docstring): vllm, hf or kv."""
    if device == "cuda":
        return "vllm" if rl_engine == "vllm" else "hf"
    return "kv"


def sampling_job_engine(
    model_dir: str | Path,
    tokenizer: Any,
    precision: Precision,
    rl_engine: str,
    vllm: VLLMSettings | None,
    seed: int,
    batch_size: int = 64,
) -> Any:
    """A sampling job's engine for the model in `model_dir`, on the job's device (precision.device):
    vLLM loads the model itself on the GPU; otherwise the model is loaded onto the device and sampled
    there. Close it (`close_engine`) before loading another model's."""
    name = sampling_job_engine_name(precision.device, rl_engine)
    if name == "vllm":
        from meml.training.rollout_vllm import VLLMEngine

        if vllm is None:
            raise DataError("the vllm engine needs the rl.vllm settings", None, None, "rl.vllm")
        return VLLMEngine(model_dir, tokenizer, precision, vllm, seed)
    import torch
    from transformers import AutoModelForCausalLM

    from meml.core.attention import attention_kwargs

    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, **attention_kwargs(precision.device))
    model.to(torch.device(precision.device))  # the GPU, on a GPU grid
    return sampling_engine(model, tokenizer, batch_size, precision)


def close_engine(engine: Any) -> None:
    """Give back an engine's memory where it holds its own (vLLM's weights and KV cache)."""
    close = getattr(engine, "close", None)
    if close is not None:
        close()
