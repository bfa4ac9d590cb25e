"""Which rollout engine a run uses (`rl.engine`): kv (the default: the CPU sampling engine,
kv_decode.py), hf (transformers' generate), hf-copy, or vllm; and which engine the sampling jobs
(calibration, complementarity) use."""

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
