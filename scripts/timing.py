"""Timing helpers shared by the benchmark scripts (imported from the scripts' own folder)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def best_time(fn: Callable[[], Any], calls: int = 200, warmup: int = 20) -> float:
    """Seconds a call: the best of five rounds of `calls`, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - started) / calls)
    return best


def matrix_rate() -> float:
    """FLOP/s of a 1024 x 1024 float32 product on the current threads, best of five rounds of ten."""
    import torch

    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    return 2 * 1024**3 / best_time(lambda: a @ b, calls=10, warmup=3)
