"""SFT and the complementarity analysis, killed with SIGKILL and run again, end where an
uninterrupted run ends: SFT from its newest checkpoint (to the same weights), complementarity from
its saved chunks (to the same figures). What a preempted SLURM job relies on (profiles/slurm)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import PROJECT
from safetensors.torch import load_file

from meml.data.experts import DEFAULT_PROMPTS
from meml.data.tiny_models import build_tiny_models, toy_corpus

pytestmark = pytest.mark.slow


def _run(*args: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{PROJECT / 'tests'}:{PROJECT / 'pipeline'}", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(PROJECT / "tests/resume_worker.py"), *map(str, args)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, -9), done.stderr[-3000:]
    return done


def _worker(*args: object) -> int:
    return _run(*args).returncode


@pytest.fixture(scope="module")
def tiny(small_world: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("resume_models")
    return build_tiny_models(toy_corpus(small_world, DEFAULT_PROMPTS), out, seed=0, vocab_size=400)["qwen2"]


def test_sft_killed_after_a_checkpoint_resumes_to_the_uninterrupted_weights(
    small_world: Path, tiny: Path, tmp_path: Path
) -> None:
    assert _worker("sft", tiny, small_world, tmp_path / "clean", 0, "none") == 0  # no checkpoints at all
    killed = tmp_path / "killed"
    assert _worker("sft", tiny, small_world, killed, 5, "2") == -9  # dies right after the step-10 checkpoint
    assert [p.name for p in (killed / "work").glob("checkpoint-*")] == ["checkpoint-10"]
    assert not (killed / "DONE").exists()
    rerun = _run("sft", tiny, small_world, killed, 5, "none")
    assert rerun.returncode == 0 and "resuming" in rerun.stderr and "from checkpoint-10" in rerun.stderr
    clean, resumed = (json.loads((run / "DONE").read_text()) for run in (tmp_path / "clean", killed))
    assert resumed["steps"] == clean["steps"] > 10
    assert resumed["loss_curve"] == clean["loss_curve"]  # the first steps' losses come back from the checkpoint
    a, b = (load_file(run / "model/model.safetensors") for run in (tmp_path / "clean", killed))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "weights differ after resuming"
    assert not (killed / "work").exists()


def test_sft_starts_over_when_what_defines_the_run_changed(small_world: Path, tiny: Path, tmp_path: Path) -> None:
    from meml.core.environment import weights_sha256
    from meml.training.sft import resumable_checkpoint, run_identity

    run = tmp_path / "run"
    assert _worker("sft", tiny, small_world, run, 5, "1") == -9
    identity = json.loads((run / "work/identity.json").read_text())["identity"]
    assert resumable_checkpoint(run / "work", identity) == run / "work/checkpoint-5"
    assert resumable_checkpoint(run / "work", "another run") is None
    (run / "work/checkpoint-5/trainer_state.json").write_text('{"global_st')  # cut short by a kill
    assert resumable_checkpoint(run / "work", identity) is None
    rows = [{"messages": [{"role": "user", "content": "q"}]}]
    start = weights_sha256(tiny)
    assert run_identity(start, rows, {"lr": 1, "checkpoint_every": 5}) == run_identity(start, rows, {"lr": 1})
    assert run_identity(start, rows, {"lr": 1}) != run_identity(start, rows, {"lr": 2})
    assert run_identity(start, rows, {"lr": 1}) != run_identity("other weights", rows, {"lr": 1})


def test_complementarity_killed_after_a_chunk_resumes_to_the_same_figures(
    small_world: Path, tiny: Path, tmp_path: Path
) -> None:
    assert _worker("complementarity", tiny, small_world, tmp_path / "clean", "none") == 0
    killed = tmp_path / "killed"
    assert _worker("complementarity", tiny, small_world, killed, "4") == -9
    assert len(list(Path(f"{killed}.work").glob("e*-c*.json"))) == 4 and not Path(f"{killed}.json").exists()
    rerun = _run("complementarity", tiny, small_world, killed, "none")
    assert rerun.returncode == 0 and "chunks sampled: 5" in rerun.stderr  # 9 chunks, 4 of them saved before
    clean, resumed = (json.loads(Path(f"{stem}.json").read_text()) for stem in (tmp_path / "clean", killed))
    assert resumed == clean and clean["questions"] > 8  # more than one chunk per expert
    assert not Path(f"{killed}.work").exists()
