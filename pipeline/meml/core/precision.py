"""Numeric precision, decided once from the config and used by every stage and both engines.

    precision: auto   -> bf16 on cuda, fp32 on cpu
               bf16   -> bf16 autocast over fp32 master weights (cuda only): the optimiser keeps
                         fp32 weights, because updates at the paper's lr of 1e-6 vanish when added
                         to bf16 weights; the rollout engines sample in bf16
               fp32   -> everything fp32 (the CPU default; on cuda for debugging)
    gradient_checkpointing: auto -> on with bf16 on cuda (memory for G = 8 long rollouts), else off

The RL loop, SFT, evaluation and the vLLM engine all read the same `Precision`, so a run never
samples in one precision and trains in another without saying so (the run's params record it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from meml.core.io import DataError


@dataclass(frozen=True)
class Precision:
    device: str  # "cpu" or "cuda"
    dtype: str  # "float32" or "bfloat16": the compute dtype (autocast, engines, evaluation)
    gradient_checkpointing: bool

    @property
    def bf16(self) -> bool:
        return self.dtype == "bfloat16"

    def torch_dtype(self) -> Any:
        import torch

        return getattr(torch, self.dtype)

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """bf16 autocast on cuda; nothing on fp32 (master weights stay fp32 either way)."""
        import torch

        with torch.autocast(device_type=self.device, dtype=torch.bfloat16, enabled=self.bf16):
            yield


def resolve(device: str, precision: str = "auto", gradient_checkpointing: str | bool = "auto") -> Precision:
    """The precision of a run; bf16 on a CPU is refused rather than emulated slowly."""
    if device not in ("cpu", "cuda"):
        raise DataError(f"unknown device '{device}'; known: cpu, cuda", None, None, "device")
    if precision == "auto":
        precision = "bf16" if device == "cuda" else "fp32"
    if precision not in ("bf16", "fp32"):
        raise DataError(f"unknown precision '{precision}'; known: auto, bf16, fp32", None, None, "precision")
    if precision == "bf16" and device == "cpu":
        raise DataError("bf16 needs device: cuda (CPU runs are fp32)", None, None, "precision")
    checkpointing = precision == "bf16" if gradient_checkpointing == "auto" else bool(gradient_checkpointing)
    return Precision(device, "bfloat16" if precision == "bf16" else "float32", checkpointing)


def of_config(cfg: dict[str, Any]) -> Precision:
    return resolve(cfg["device"], cfg["precision"], cfg["gradient_checkpointing"])
