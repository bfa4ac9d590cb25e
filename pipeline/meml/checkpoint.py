"""Checkpoints of an RL run: everything needed to continue as if never interrupted.

A checkpoint is a folder `step-000010/` with `state.pt` (model, optimizer, scheduler, RNG states,
data position, hard-example buffer, step) and a `COMPLETE` marker written last. It is written
under a temporary name and renamed; a folder without the marker is never resumed from.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import torch

from .io import atomic_write_text


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()  # sampling on a GPU draws from this one
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save(folder: str | Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".step-{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(state, tmp / "state.pt")
    atomic_write_text(tmp / "COMPLETE", f"{step}\n")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in sorted(p for p in root.glob("step-*") if (p / "COMPLETE").is_file())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(folder: str | Path) -> Path | None:
    """The newest checkpoint with its COMPLETE marker, or None."""
    root = Path(folder)
    done = sorted(p for p in root.glob("step-*") if (p / "COMPLETE").is_file()) if root.is_dir() else []
    return done[-1] if done else None


def load(path: str | Path) -> dict[str, Any]:
    return dict(torch.load(Path(path) / "state.pt", weights_only=False))
