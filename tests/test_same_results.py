"""scripts/same_results.py: the check behind "the same seed gives the same numbers" across two runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import PROJECT

SCRIPT = PROJECT / "scripts" / "same_results.py"


def _run(a: Path, b: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), str(a), str(b)], capture_output=True, text=True, timeout=60)


def _results(root: Path, reward: float, seconds: float) -> Path:
    folder = root / "results" / "toy"
    cell = folder / "rl" / "qwen2" / "gsm8k" / "MEML-GRPO" / "seed0"
    cell.mkdir(parents=True)
    (cell / "metrics.jsonl").write_text(json.dumps({"step": 0, "reward/mean": reward, "perf/step_seconds": seconds}))
    (cell / "DONE").write_text(json.dumps({"steps": 1, "mlflow_run_id": f"id{seconds}", "reward_last": reward}))
    (cell / "model.safetensors").write_bytes(b"weights")
    (folder / "mlflow.db").write_bytes(str(seconds).encode())  # left out: run ids and times
    return folder


def test_timings_are_set_aside_and_a_changed_number_is_not(tmp_path: Path) -> None:
    first = _results(tmp_path / "a", 0.5, 1.0)
    same = _results(tmp_path / "b", 0.5, 2.0)  # other timings, other MLflow ids
    done = _run(first, same)
    assert done.returncode == 0, done.stdout
    assert "identical: 1\nsame but for timings: 2\nchanged as declared: 0\ndifferent: 0" in done.stdout
    other = _results(tmp_path / "c", 0.25, 1.0)  # another reward
    done = _run(first, other)
    assert done.returncode == 1
    assert "different: rl/qwen2/gsm8k/MEML-GRPO/seed0/metrics.jsonl (at [0].reward/mean)" in done.stdout
    assert "different: rl/qwen2/gsm8k/MEML-GRPO/seed0/DONE (at reward_last)" in done.stdout
    (other / "rl/qwen2/gsm8k/MEML-GRPO/seed0/model.safetensors").unlink()
    assert "missing: rl/qwen2/gsm8k/MEML-GRPO/seed0/model.safetensors" in _run(first, other).stdout


def test_a_differing_json_file_names_the_keys_that_differ(tmp_path: Path) -> None:
    first, second = _results(tmp_path / "a", 0.5, 1.0), _results(tmp_path / "b", 0.5, 1.0)
    cell = Path("rl/qwen2/gsm8k/MEML-GRPO/seed0/cell.json")
    (first / cell).write_text(json.dumps({"sft": {"lr": 1e-4, "checkpoint_every": 200}, "seed": 0}))
    (second / cell).write_text(json.dumps({"sft": {"lr": 1e-4}, "seed": 0}))  # a key on one side only
    assert f"different: {cell.as_posix()} (at sft.checkpoint_every)" in _run(first, second).stdout
    (second / cell).write_text(json.dumps({"sft": {"lr": 2e-4, "checkpoint_every": 200}, "seed": 1}))
    assert f"different: {cell.as_posix()} (at sft.lr, seed)" in _run(first, second).stdout


def test_a_declared_change_is_listed_and_passes_while_any_other_fails(tmp_path: Path) -> None:
    first, second = _results(tmp_path / "a", 0.5, 1.0), _results(tmp_path / "b", 0.5, 1.0)
    cell = Path("rl/qwen2/gsm8k/MEML-GRPO/seed0/cell.json")
    (first / cell).write_text(json.dumps({"sft": {"lr": 1e-4, "checkpoint_every": 200}, "seed": 0}))
    (second / cell).write_text(json.dumps({"sft": {"lr": 1e-4}, "seed": 0}))
    done = subprocess.run([sys.executable, str(SCRIPT), str(first), str(second), "--declared", "sft.checkpoint_every"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout
    assert f"changed as declared: {cell.as_posix()} (at sft.checkpoint_every)" in done.stdout
    (second / cell).write_text(json.dumps({"sft": {"lr": 2e-4}, "seed": 0}))  # and another change beside it
    done = subprocess.run([sys.executable, str(SCRIPT), str(first), str(second), "--declared", "sft.checkpoint_every"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1 and f"different: {cell.as_posix()} (at sft.lr, sft.checkpoint_every)" in done.stdout
