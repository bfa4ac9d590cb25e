"""Which rollout engine a run uses (`rl.engine`): hf (the default), hf-copy, or vllm."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from meml.core.io import DataError
from meml.core.precision import Precision
from meml.training.rollout import HFCopyEngine, HFEngine, RolloutEngine

ENGINES = ("hf", "hf-copy", "vllm")


def make_engine(
    name: str,
    policy: Any,
    model_dir: str | Path,
    tokenizer: Any,
    settings: dict[str, Any],
    precision: Precision,
    seed: int,
    rank: int = 0,
) -> RolloutEngine:
    batch = int(settings["rollout_batch_size"])
    if name == "hf":
        return HFEngine(policy, tokenizer, batch, precision)
    if name == "hf-copy":
        return HFCopyEngine(policy, tokenizer, batch, precision)
    if name == "vllm":
        from meml.training.rollout_vllm import VLLMEngine

        return VLLMEngine(model_dir, tokenizer, precision, settings, seed + rank)
    raise DataError(f"unknown rollout engine '{name}'; known: {', '.join(ENGINES)}", None, None, "rl.engine")
