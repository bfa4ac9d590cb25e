"""An RL run's folder across its life: start (whose folder it is), resume (the newest checkpoint
that verifies), save (a checkpoint), finish (the final model and DONE).

Everything that can fail is loaded and checked (rl.load) before an old run in the folder is
touched; a run whose cell values changed, or whose DONE was removed (`snakemake --forcerun`), is
moved into <run>/previous/<time>/ (nothing is deleted) and its MLflow run retagged.

Finishing is a sequence that a crash may cut anywhere, and a rerun resumes it: the last checkpoint
(the last step) stays until DONE is written, so a rerun loads it, runs no step, and finishes again;
each step of `finish` can be done twice. A forced rerun is told apart by what it changes: it removes
a DONE that had been written, and `finished.json`, written right after DONE and kept by Snakemake
(it is no output of the rule), says one had been. A crash before DONE leaves no finished.json.

A checkpoint keeps, by name, what rl.RunState.checkpointed gives (the model, both optimisers, the
schedule, the question order, the buffer), the step, and one RNG state per process.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from meml.core.io import DataError, atomic_write_json
from meml.core.tracking import MLflowSettings, Tracker, read_metrics
from meml.training import checkpoint
from meml.training.distributed import Dist

RUN_FILES = ("checkpoints", "model", "metrics.jsonl", "DONE", "finished.json", "mlflow_run_id", "cell.json")


def start(out: Path, params: dict[str, Any], steps: int, mlflow: MLflowSettings | None, dist: Dist) -> None:
    """The folder is this run's: an old run of other values, or a finished one forced to rerun,
    moves aside first. Only now is the folder touched."""
    if dist.is_main:
        newest = checkpoint.newest_marked(out / "checkpoints")  # no checksum needed to read its step
        last_kept = newest is not None and checkpoint.step_of(newest) >= steps
        if not same_params(out, params):
            move_aside(out, "the cell's values changed", mlflow)
        elif not (out / "DONE").is_file() and (
            (out / "finished.json").is_file() or ((out / "model").exists() and not last_kept)
        ):
            # DONE had been written and is gone (snakemake --forcerun): train the cell again. (A final
            # model without its last checkpoint is a finished run too: finish removes that checkpoint
            # only after DONE, under rl.keep_checkpoints: false, or the run predates finished.json.)
            # A final model beside the last checkpoint and no finished.json is a crash inside
            # finish: resume loads the last step and finish runs again, nothing is retrained.
            move_aside(out, "its DONE marker was removed (a forced rerun)", mlflow)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / "cell.json", params)
    dist.barrier()


def resume(out: Path, parts: dict[str, Any], seed: int, dist: Dist) -> int:
    """Continue from the newest checkpoint that verifies: each of `parts` (name -> an object with
    load_state_dict) gets its state back. The step to start at (0: a new run)."""
    last = checkpoint.latest(out / "checkpoints")
    if last is None:
        if dist.rank > 0:
            torch.manual_seed(seed + 7919 * dist.rank)  # each process samples its own rollouts
        return 0
    state = checkpoint.load(last)
    for name, part in parts.items():
        part.load_state_dict(state[name])
    rngs = state["rng"] if isinstance(state["rng"], list) else [state["rng"]]
    if len(rngs) != dist.world:
        raise DataError(f"checkpoint of {len(rngs)} process(es) cannot resume in {dist.world}", last)
    checkpoint.set_rng_state(rngs[dist.rank])
    return int(state["step"])


def save(out: Path, done_steps: int, parts: dict[str, Any], dist: Dist, tracker: Tracker | None) -> None:
    """A checkpoint of `parts` (the main process writes it); then these steps' metrics reach MLflow."""
    rngs = dist.gather(checkpoint.rng_state())
    if dist.is_main:
        state = {"step": done_steps, **{name: part.state_dict() for name, part in parts.items()}}
        checkpoint.save(out / "checkpoints", done_steps, {**state, "rng": rngs})  # one RNG state per process
        assert tracker is not None
        tracker.commit()
    dist.barrier()


def finish(
    out: Path,
    tokenizer: Any,
    policy: Any,
    summary: dict[str, Any],
    environment: dict[str, Any],
    dist: Dist,
    tracker: Tracker | None,
    keep_checkpoints: bool = True,
) -> dict[str, Any]:
    """The final model, MLflow's artifacts, DONE (the summary, with the metrics' first and last
    rewards), then `settle`: finished.json, and (keep_checkpoints false) the checkpoints go. A crash at any
    point leaves the last checkpoint beside no DONE, which the rerun resumes into this function
    again; every step here may run twice (the model is rewritten atomically, the MLflow run
    reopened and closed)."""
    if dist.is_main:
        from meml.data.tiny_models import save_atomically

        assert tracker is not None
        save_atomically(out / "model", tokenizer, policy)
        lines = read_metrics(out / "metrics.jsonl")
        done = {
            **summary,
            "final": lines[-1] if lines else {},
            "reward_first": lines[0]["reward/mean"] if lines else None,
            "reward_last": lines[-1]["reward/mean"] if lines else None,
            "mlflow_run_id": tracker.run_id,
            "environment": environment,
        }
        tracker.log_artifact(out / "metrics.jsonl")
        tracker.log_artifact(out / "cell.json")  # the values that define the cell
        tracker.close()
        atomic_write_json(out / "DONE", done)
    dist.barrier()
    return settle(out, keep_checkpoints, dist)


def settle(out: Path, keep_checkpoints: bool, dist: Dist) -> dict[str, Any]:
    """What follows DONE, also for a run found finished (a crash may have come between): finished.json
    (a DONE was written, so its removal is a forced rerun), then the checkpoints go (keep_checkpoints
    false). Returns DONE."""
    done = dict(json.loads((out / "DONE").read_text()))
    if dist.is_main:
        if not (out / "finished.json").is_file():
            atomic_write_json(out / "finished.json", done)
        if not keep_checkpoints:
            shutil.rmtree(out / "checkpoints", ignore_errors=True)
    return done


def move_aside(out: Path, why: str, mlflow: MLflowSettings | None) -> None:
    """Move a previous run's files into out/previous/<time>/ (nothing is deleted), and retag its
    MLflow run so that the new run gets a run of its own."""
    present = [name for name in RUN_FILES if (out / name).exists()]
    if not present:
        return
    aside = out / "previous" / time.strftime("%Y%m%d-%H%M%S")
    aside.mkdir(parents=True, exist_ok=True)
    run_id = (out / "mlflow_run_id").read_text().strip() if (out / "mlflow_run_id").is_file() else None
    for name in present:
        (out / name).rename(aside / name)
    if run_id and mlflow is not None and mlflow.enabled:
        from meml.core.tracking import retire_run

        retire_run(mlflow, run_id, aside.name)
    print(f"rl: {why}; the previous run's files are in {aside}", file=sys.stderr)


def same_params(out: Path, params: dict[str, Any]) -> bool:
    """True when out/cell.json holds these params, or when neither exists (nothing to compare)."""
    path = out / "cell.json"
    if not path.is_file():
        return not (out / "checkpoints").exists()
    return bool(json.loads(path.read_text()) == json.loads(json.dumps(params)))
