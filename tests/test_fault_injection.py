"""Kill an RL run with SIGKILL at chosen points (during rollouts, halfway through a checkpoint
write, right after a buffer flush) and resume it each time: the result must be the uninterrupted
run's, to the bit, with one MLflow run in which every (metric, step) appears once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import PROJECT

from meml.data.experts import DEFAULT_PROMPTS
from meml.data.tiny_models import build_tiny_models, toy_corpus

pytestmark = pytest.mark.slow  # `pytest -m "not slow"` for a quick round

FAULTS = ["rollouts:2", "checkpoint:2", "flush:1", "rollouts:1"]  # each counted from its own start


def _worker(model: Path, world: Path, out: Path, store: str, fault: str) -> int:
    return _worker_run(model, world, out, store, fault).returncode


def _worker_run(model: Path, world: Path, out: Path, store: str, fault: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{PROJECT / 'tests'}:{PROJECT / 'pipeline'}", "OMP_NUM_THREADS": "1"}
    args = [sys.executable, str(PROJECT / "tests/rl_worker.py"), str(model), str(world), str(out), store, fault]
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]  # timing differs


def test_killed_and_resumed_run_equals_the_uninterrupted_one(small_world: Path, tmp_path: Path) -> None:
    import mlflow

    from meml.core.tracking import MLflowSettings, ensure_experiment

    model = build_tiny_models(toy_corpus(small_world, DEFAULT_PROMPTS), tmp_path / "m", seed=0, vocab_size=400)["llama"]
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ensure_experiment(MLflowSettings(store, "faults"))  # created once, before the workers
    assert _worker(model, small_world, tmp_path / "clean", store, "none") == 0
    faulty = tmp_path / "faulty"
    for fault in FAULTS:
        assert _worker(model, small_world, faulty, store, fault) == -9, f"{fault} did not fire"
        assert not (faulty / "DONE").exists()
    assert _worker(model, small_world, faulty, store, "none") == 0

    clean = AutoModel(tmp_path / "clean")
    assert clean.keys() == AutoModel(faulty).keys()
    assert all(torch.equal(clean[k], AutoModel(faulty)[k]) for k in clean), "weights differ after resuming"
    assert _metrics(faulty) == _metrics(tmp_path / "clean")
    assert sum(r["hsft/sft_examples"] > 0 for r in _metrics(faulty)) >= 2  # flushes did happen

    mlflow.set_tracking_uri(store)
    runs = mlflow.search_runs(experiment_names=["faults"], filter_string="tags.cell_key = 'faults/faulty'",
                              output_format="list")  # fmt: skip
    assert len(runs) == 1
    client = mlflow.MlflowClient()
    for key in ("reward/mean", "hsft/flushes", "loss/total"):
        steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, key)]
        assert sorted(steps) == [0, 1, 2, 3], f"{key}: {sorted(steps)}"  # each step once


FINISH_POINTS = ["model", "artifacts", "closed", "done", "finished"]


def test_a_crash_inside_finish_resumes_to_the_same_done_without_training_again(
    small_world: Path, tmp_path: Path
) -> None:
    """Kill the job at each point of rl_run.finish and run it again: the rerun loads the last
    checkpoint, trains no step, and ends with the uninterrupted run's DONE, model and metrics; no
    run is moved aside as a forced rerun; MLflow holds one run with each step once. After the
    last point (DONE and finished.json written) the rerun returns at once. A forced rerun of the
    finished cell (DONE removed) still trains again."""
    import mlflow

    from meml.core.tracking import MLflowSettings, ensure_experiment

    model = build_tiny_models(toy_corpus(small_world, DEFAULT_PROMPTS), tmp_path / "m", seed=0, vocab_size=400)["llama"]
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ensure_experiment(MLflowSettings(store, "faults"))
    assert _worker(model, small_world, tmp_path / "clean", store, "none") == 0
    clean_done = json.loads((tmp_path / "clean/DONE").read_text())
    for point in FINISH_POINTS:
        run = tmp_path / point
        assert _worker(model, small_world, run, store, f"finish:{point}") == -9, f"{point} did not fire"
        assert (run / "model").exists() and (point in ("done", "finished")) == (run / "DONE").exists()
        again = _worker_run(model, small_world, run, store, "finish:none")
        assert again.returncode == 0, again.stderr[-2000:]
        if point not in ("done", "finished"):
            assert "at step 4 of 4" in again.stderr, f"{point}: the rerun did not resume at the last step"
        assert not (run / "previous").exists(), f"{point}: taken for a forced rerun"
        assert (run / "DONE").is_file() and (run / "finished.json").is_file()
        done = json.loads((run / "DONE").read_text())
        assert {k: v for k, v in done.items() if k not in ("final", "mlflow_run_id")} == {
            k: v for k, v in clean_done.items() if k not in ("final", "mlflow_run_id")
        }
        assert _metrics(run) == _metrics(tmp_path / "clean"), f"{point}: steps trained again"
        clean = AutoModel(tmp_path / "clean")
        assert all(torch.equal(clean[k], AutoModel(run)[k]) for k in clean), f"{point}: weights differ"
        assert not (run / "checkpoints").exists()  # keep_checkpoints: false, removed after DONE
        mlflow.set_tracking_uri(store)
        runs = mlflow.search_runs(experiment_names=["faults"], filter_string=f"tags.cell_key = 'faults/{point}'",
                                  output_format="list")  # fmt: skip
        assert len(runs) == 1, f"{point}: {len(runs)} MLflow runs"
        steps = [m.step for m in mlflow.MlflowClient().get_metric_history(runs[0].info.run_id, "reward/mean")]
        assert sorted(steps) == [0, 1, 2, 3], f"{point}: {sorted(steps)}"
    forced = tmp_path / "finished"
    (forced / "DONE").unlink()  # what snakemake --forcerun does
    assert _worker(model, small_world, forced, store, "finish:none") == 0
    assert (forced / "previous").is_dir() and (forced / "DONE").is_file()


def AutoModel(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(next((run / "model").glob("*.safetensors"))))


@pytest.fixture(autouse=True)
def _project_on_path() -> None:
    assert (PROJECT / "tests/rl_worker.py").is_file()
