"""Checkpoints of an RL run: everything needed to continue as if never interrupted.

A checkpoint is a folder `step-000010/` with `state.pt` (model, optimizers, scheduler, RNG states,
data position, hard-example buffer, step) and a `COMPLETE` marker written last, which holds the
step and the SHA-256 of `state.pt` (hashed while it is written, so no second read). The folder is
written under a temporary name and renamed. `latest` verifies the checksum and falls back to the
newest older checkpoint that verifies, saying which it skipped and why: a file truncated by a full
disk or a bad copy never blocks a resume.
"""

from __future__ import annotations

import hashlib
import random
import shutil
import sys
from pathlib import Path
from typing import Any, BinaryIO

import torch

from meml.core.io import DataError, atomic_write_text


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


class _HashingWriter:
    """A write-only file that hashes what passes through it."""

    def __init__(self, file: BinaryIO) -> None:
        self.file, self.sha = file, hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()


def save(folder: str | Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".step-{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    with (tmp / "state.pt").open("wb") as f:
        writer = _HashingWriter(f)
        torch.save(state, writer)  # type: ignore[arg-type]
    atomic_write_text(tmp / "COMPLETE", f"{step}\nsha256 {writer.sha.hexdigest()}\n")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in sorted(p for p in root.glob("step-*") if (p / "COMPLETE").is_file())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def problem(path: Path) -> str | None:
    """Why a checkpoint folder cannot be resumed from, or None when its state.pt verifies."""
    marker, state = path / "COMPLETE", path / "state.pt"
    if not marker.is_file():
        return "no COMPLETE marker (it was being written)"
    if not state.is_file():
        return "state.pt is missing"
    lines = marker.read_text().split()
    if "sha256" not in lines:
        return "COMPLETE holds no checksum"
    want = lines[lines.index("sha256") + 1]
    sha = hashlib.sha256()
    with state.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
    return None if sha.hexdigest() == want else "state.pt does not match its checksum (truncated or damaged)"


def latest(folder: str | Path) -> Path | None:
    """The newest checkpoint that verifies, or None; each one skipped is named on stderr."""
    root = Path(folder)
    for path in sorted(root.glob("step-*"), reverse=True) if root.is_dir() else []:
        why = problem(path)
        if why is None:
            return path
        print(f"resume: skipping checkpoint {path}: {why}", file=sys.stderr)
    return None


def newest_marked(folder: str | Path) -> Path | None:
    """The newest checkpoint with a COMPLETE marker, unverified (cheap: reads no state.pt)."""
    root = Path(folder)
    marked = sorted(p for p in root.glob("step-*") if (p / "COMPLETE").is_file()) if root.is_dir() else []
    return marked[-1] if marked else None


def step_of(path: str | Path) -> int:
    """The step a checkpoint folder holds (the first line of its COMPLETE marker)."""
    return int((Path(path) / "COMPLETE").read_text().split()[0])


def load(path: str | Path) -> dict[str, Any]:
    try:
        return dict(torch.load(Path(path) / "state.pt", weights_only=False))
    except Exception as err:  # torch raises several types for a damaged file
        raise DataError(f"checkpoint cannot be read ({type(err).__name__}: {err})", Path(path) / "state.pt") from None


def check_model_folder(path: str | Path) -> Path:
    """A saved model a later stage may read: weights present, and the run that wrote it finished."""
    folder = Path(path)
    if not folder.is_dir():
        raise DataError("checkpoint folder not found", folder)
    if not (folder / "config.json").is_file():
        raise DataError("not a model folder: config.json is missing", folder)
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
        raise DataError("model folder has no weights (*.safetensors or *.bin)", folder)
    run = folder.parent
    if ((run / "checkpoints").is_dir() or (run / "work").is_dir()) and not (run / "DONE").is_file():
        raise DataError("the run that wrote this model has not finished (no DONE marker)", run)
    return folder
