"""One SFT run, or one complementarity analysis, in its own process, for tests/test_resume.py. With
a fault `<n>` the process SIGKILLs itself right after the n-th checkpoint (SFT) or the n-th chunk
of samples (complementarity) is written; `none` runs to the end, and says how many chunks it
sampled itself (complementarity).

    resume_worker.py sft <model> <world> <out> <checkpoint_every> <fault>
    resume_worker.py complementarity <model> <world> <out_stem> <fault>
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from meml.core.config import load_config

calls = [0]


def after_nth(module: Any, name: str, n: int) -> None:
    """Wrap module.name so that the process dies right after its n-th call returns (never: n = 0);
    `calls` counts them."""
    original = getattr(module, name)

    def then_die(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        calls[0] += 1
        if calls[0] == n:
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    setattr(module, name, then_die)


def sft(model: Path, world: Path, out: Path, every: int, fault: str) -> None:
    from transformers import Trainer

    from meml.training.sft import run_sft

    if fault != "none":
        after_nth(Trainer, "_save_checkpoint", int(fault))
    settings = dict(load_config()["sft"], epochs=1, max_length=384, batch_size=8, checkpoint_every=every)
    run_sft(model, world / "data/gsm8k", world / "experts/gsm8k", out, [0, 1, 2], settings)


def complementarity(model: Path, world: Path, out_stem: Path, fault: str) -> None:
    from meml.evaluation import complementarity as analysis
    from meml.training.rollout import Sampling

    after_nth(analysis, "save_chunk", int(fault) if fault != "none" else 0)
    sampling = Sampling(max_new_tokens=12, temperature=1.0)
    analysis.run(model, world / "data/gsm8k/test.jsonl", [0, 1, 2], 2, sampling, out_stem, "t", batch_size=8)
    print(f"chunks sampled: {calls[0]}", file=sys.stderr)


if __name__ == "__main__":
    kind, *rest = sys.argv[1:]
    if kind == "sft":
        sft(Path(rest[0]), Path(rest[1]), Path(rest[2]), int(rest[3]), rest[4])
    else:
        complementarity(Path(rest[0]), Path(rest[1]), Path(rest[2]), rest[3])
