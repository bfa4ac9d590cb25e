"""Numeric precision, decided once from the config and used by every stage and every engine.

    precision: auto   -> bf16 on cuda, fp32 on cpu
               bf16   -> bf16 autocast over fp32 master weights: the optimiser keeps fp32 weights,
                         because updates at the paper's lr of 1e-6 vanish when added to bf16
                         weights; the rollout engines and evaluation compute in bf16. On a CPU only
                         where it has bf16 arithmetic (AVX512-BF16 or AMX): elsewhere torch emulates
                         it, slower than fp32, so it is refused
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
        """bf16 autocast (cuda or cpu); nothing on fp32 (master weights stay fp32 either way)."""
        import torch

        with torch.autocast(device_type=self.device, dtype=torch.bfloat16, enabled=self.bf16):
            yield


def resolve(device: str, precision: str = "auto", gradient_checkpointing: str | bool = "auto") -> Precision:
    """The precision of a run; bf16 on a CPU without bf16 arithmetic is refused rather than emulated slowly."""
    if device not in ("cpu", "cuda"):
        raise DataError(f"unknown device '{device}'; known: cpu, cuda", None, None, "device")
    if precision == "auto":
        precision = "bf16" if device == "cuda" else "fp32"
    if precision not in ("bf16", "fp32"):
        raise DataError(f"unknown precision '{precision}'; known: auto, bf16, fp32", None, None, "precision")
    if precision == "bf16" and device == "cpu" and not cpu_has_bf16():
        raise DataError(
            "bf16 on this CPU would be emulated (no AVX512-BF16 or AMX): slower than fp32; use precision: fp32",
            None,
            None,
            "precision",
        )
    auto = precision == "bf16" and device == "cuda"  # on a CPU memory is not the limit, and trl needs it off there
    checkpointing = auto if gradient_checkpointing == "auto" else bool(gradient_checkpointing)
    return Precision(device, "bfloat16" if precision == "bf16" else "float32", checkpointing)


def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (x86: AVX512-BF16 or AMX tiles)."""
    import torch

    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def of_config(cfg: dict[str, Any]) -> Precision:
    return resolve(cfg["device"], cfg["precision"], cfg["gradient_checkpointing"])
