"""A workflow run's start and end, as the Snakefile's onstart, onsuccess and onerror call them.

    start(workflow, config)    the progress file; the MLflow store where the config moved it; the warm
                               worker (worker.py) on a local run, or the SLURM plugin's patch on a
                               cluster (cluster.py); GPU records; on a local run of a cuda config with
                               GPU jobs to run, the CUDA check (core/cuda_check.py) before any job
    finish(workflow, config)   the worker stopped; report/<profile>/run.json; the closing message
    failed(workflow, config)   the worker stopped; run.json (a failed part still cost what it cost);
                               the calibration gate's messages
    use_workflow_code(folder)  every job, and the worker, imports meml from the workflow's own folder

Jobs run without the worker on a cluster (`workflow.non_local_exec`): they start on other nodes,
which cannot reach this machine's socket, and on this one the worker would run them outside the
scheduler's control; `meml.run` falls back to a fresh process when MEML_WORKER is unset.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from meml import worker
from meml.core.config import offline_env
from meml.plan.layout import Layout

_WORKER: dict[str, Any] = {}  # the worker process this run started, while it runs


def use_workflow_code(pipeline: Path) -> None:
    """Put the workflow's own `pipeline` folder first on the PYTHONPATH that jobs and the worker
    inherit. Why: jobs start the venv's Python (`python -m meml.run`), which imports meml from
    wherever the venv was installed from. A second clone or a git worktree that shares a venv (the
    way to keep a long run on a fixed commit while the first clone moves on) would otherwise run the
    first clone's code, while run.json records the second's commit. The environment is not part of
    what Snakemake compares, so this reruns nothing."""
    folder = str(pipeline.resolve())
    others = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != folder]
    os.environ["PYTHONPATH"] = os.pathsep.join([folder, *others])


def progress_file(config: dict[str, Any]) -> Path:
    """Where the run's start time and job counts live for `meml.progress` (a line per finished cell)."""
    return Layout.of(config).root / ".progress.json"


def start(workflow: Any, config: dict[str, Any], gpus: int) -> None:
    """Snakefile's onstart. `gpus`: GPUs a job takes (0 on a CPU, MEML_SIMULATE_GPUS counts)."""
    layout = Layout.of(config)
    layout.root.mkdir(parents=True, exist_ok=True)
    # `all` has no output, so no job record: it is never counted as done, nor as left
    rules = collections.Counter(job.rule.name for job in workflow.dag.needrun_jobs() if job.rule.name != "all")
    state = {"start": time.time(), "total": len(workflow.dag), "rules": rules}
    progress_file(config).write_text(json.dumps(state))
    mlflow_store(config)
    if workflow.non_local_exec:
        os.environ.pop("MEML_WORKER", None)
        from meml.cluster import patch_slurm_plugin  # a cancelled job must end the run (see there)

        patch_slurm_plugin()
        return
    check_cuda(workflow, config)
    logs = Path("logs", config["profile"])
    if gpus:  # each job that takes GPUs records which it got (core/gpus.py)
        logs.mkdir(parents=True, exist_ok=True)
        os.environ["MEML_GPU_LOG"] = str(logs.resolve() / "gpus.jsonl")
    socket = worker.socket_path()
    env = {"TOKENIZERS_PARALLELISM": "false", **offline_env(config)}
    _WORKER["process"] = worker.start(socket, env, device=config["device"])
    _WORKER["socket"] = socket
    if _WORKER["process"] is not None:
        os.environ["MEML_WORKER"] = str(socket)  # inherited by every local job


def check_cuda(workflow: Any, config: dict[str, Any]) -> None:
    """Before the first GPU job of a local run on real GPUs: can torch use them (core/cuda_check.py)?
    Raising here stops the run before any job. (On a cluster each GPU job checks its own node.)"""
    if config["device"] != "cuda" or os.environ.get("MEML_SIMULATE_GPUS"):
        return
    if not any(job.resources.get("gpu", 0) for job in workflow.dag.needrun_jobs()):
        return
    from meml.core.cuda_check import check

    found = check()
    if found:
        raise ValueError("device: cuda, but the GPUs cannot be used; fix first:\n  " + "\n  ".join(found))


def mlflow_store(config: dict[str, Any]) -> str | None:
    """The MLflow store and experiment the config names, made ready before any job of this run logs
    to them, where they are not those the mlflow_store job made (its marker): the mlflow keys are run
    keys (core/config.RUN_KEYS), so pointing MLflow elsewhere reruns no job, that one included, while
    jobs starting at once must not each create a new store. Returns the experiment's id, or None where
    there is nothing to do (MLflow off, or the mlflow_store job has yet to run)."""
    from meml.core.tracking import MLflowSettings, ensure_experiment

    settings = MLflowSettings.of(config)
    marker = Layout.of(config).mlflow_marker
    if not settings.enabled or not marker.is_file():
        return None
    made = json.loads(marker.read_text())
    if made.get("experiment_id") and (made.get("tracking_uri"), made.get("experiment")) == (
        settings.tracking_uri,
        settings.experiment,
    ):
        return None
    experiment_id = ensure_experiment(settings)
    print(
        f"[meml] MLflow: this run's jobs log to {settings.tracking_uri}, experiment {settings.experiment!r} "
        f"({experiment_id}); the finished jobs logged to {made.get('tracking_uri')} (experiment "
        f"{made.get('experiment')!r}) and are not rerun: mlflow.* say where results go, not what they are",
        file=sys.stderr,
    )
    return experiment_id


def _stop_worker() -> None:
    process = _WORKER.pop("process", None)
    socket = _WORKER.pop("socket", None)
    if process is not None:
        process.terminate()
        process.wait(timeout=30)
        socket.with_suffix(".log").unlink(missing_ok=True)


def _record(workflow: Any, config: dict[str, Any]) -> None:
    from meml.reporting import run_record

    if not workflow.dryrun:  # the run's own facts: report/<profile>/run.json
        run_record.write(config, progress_file(config), Path("report", config["profile"]), workflow.cores)


def finish(workflow: Any, config: dict[str, Any]) -> None:
    """Snakefile's onsuccess."""
    from meml.reporting.finish import message

    _stop_worker()
    _record(workflow, config)
    print(message(config), file=sys.stderr)


def failed(workflow: Any, config: dict[str, Any]) -> None:
    """Snakefile's onerror: what the run cost, and the calibration gate's messages (also in the jobs' logs)."""
    _stop_worker()
    _record(workflow, config)
    folder = Layout.of(config).root / "calibration"
    for failure in sorted([*folder.glob("*/*/*.failed"), *folder.glob("*/*/*/*.failed")]):
        print(failure.read_text(encoding="utf-8"), file=sys.stderr)
