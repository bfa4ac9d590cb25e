"""N jobs logging to one MLflow store at once: what each store loses, repeats or refuses.

    python scripts/mlflow_concurrency.py --uri sqlite:////tmp/x/mlflow.db --jobs 16 --steps 20
    python scripts/mlflow_concurrency.py --uri http://127.0.0.1:15000 --jobs 16 --steps 20

Each job is a process that does what an RL job of the DAG does, through the project's own Tracker:
finds or starts its cell's run (tagged `cell_key`), logs its params, then `steps` steps of
`--metrics` metrics, each step committed (sent to MLflow) at once, and ends the run. All jobs
start together (a barrier after the imports). The experiment is created first, by one process, as
the DAG's `mlflow_store` rule does. Afterwards the store is read back: runs per cell key (lost: 0,
duplicate: more than 1), and per run and metric the logged steps (lost or repeated values).

Prints one JSON line: the store, jobs, failed jobs with their first error line, runs lost and
duplicated, metric values lost and repeated, and the wall time of the slowest job.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))


def _settings(uri: str, experiment: str) -> Any:
    from meml.core.tracking import MLflowSettings

    return MLflowSettings(uri, experiment)


def _create(uri: str, experiment: str) -> None:
    from meml.core.tracking import ensure_experiment

    ensure_experiment(_settings(uri, experiment))


def _job(
    index: int, args: argparse.Namespace, folder: str, barrier: Any, results: Any
) -> None:  # pragma: no cover - runs in a child
    from meml.core.tracking import Tracker

    barrier.wait()
    start = time.perf_counter()
    error = None
    try:
        tracker = Tracker(
            Path(folder) / f"job{index}",
            f"bench/cell{index}",
            {"job": index, "steps": args.steps, "rl": {f"p{k}": k for k in range(args.params)}},
            _settings(args.uri, args.experiment),
        )
        for step in range(args.steps):
            tracker.log(step, {f"m/{k}": step + k / 100 for k in range(args.metrics)})
            tracker.commit()
        tracker.close()
    except Exception as err:  # what the job would have died of
        error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]
    results.put({"job": index, "seconds": time.perf_counter() - start, "error": error})


def check(args: argparse.Namespace) -> dict[str, Any]:
    """Runs per cell key and metric values per (run, metric), read back from the store."""
    import mlflow

    mlflow.set_tracking_uri(args.uri)
    client = mlflow.MlflowClient()
    experiment = client.get_experiment_by_name(args.experiment)
    runs = client.search_runs([experiment.experiment_id], max_results=5000) if experiment else []
    per_key = Counter(r.data.tags.get("cell_key") for r in runs)
    lost_runs = sum(1 for i in range(args.jobs) if per_key[f"bench/cell{i}"] == 0)
    duplicate_runs = sum(n - 1 for n in per_key.values() if n > 1)
    lost_values = repeated_values = 0
    for run in runs:
        for k in range(args.metrics):
            steps = Counter(m.step for m in client.get_metric_history(run.info.run_id, f"m/{k}"))
            lost_values += sum(1 for s in range(args.steps) if steps[s] == 0)
            repeated_values += sum(n - 1 for n in steps.values() if n > 1)
    lost_values += lost_runs * args.steps * args.metrics  # a lost run lost all its values
    return {
        "runs": len(runs),
        "lost_runs": lost_runs,
        "duplicate_runs": duplicate_runs,
        "lost_values": lost_values,
        "repeated_values": repeated_values,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uri", required=True, help="sqlite:///<file> or http://host:port")
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--metrics", type=int, default=20, help="metrics per step (an RL step logs about 40)")
    parser.add_argument("--params", type=int, default=50)
    parser.add_argument("--experiment", default=f"bench-{int(time.time())}")
    args = parser.parse_args(argv)

    # imported once, before the fork (both stores' modules): the time measured is the logging's
    import mlflow.store.tracking.rest_store
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401

    import meml.core.tracking  # noqa: F401

    creator = mp.get_context("spawn").Process(target=_create, args=(args.uri, args.experiment))
    creator.start()
    creator.join()
    if creator.exitcode != 0:
        print(f"could not create the experiment in {args.uri}", file=sys.stderr)
        return 1
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(args.jobs), ctx.Queue()
    with tempfile.TemporaryDirectory() as folder:
        wall = time.perf_counter()
        jobs = [ctx.Process(target=_job, args=(i, args, folder, barrier, results)) for i in range(args.jobs)]
        for job in jobs:
            job.start()
        outcomes = [results.get(timeout=1800) for _ in jobs]
        for job in jobs:
            job.join()
        wall = time.perf_counter() - wall
    errors = Counter(o["error"] for o in outcomes if o["error"])
    report = {
        "store": args.uri.split(":", 1)[0],
        "jobs": args.jobs,
        "steps": args.steps,
        "metrics": args.metrics,
        "failed_jobs": sum(errors.values()),
        "errors": dict(errors),
        "slowest_job_s": round(max(o["seconds"] for o in outcomes), 2),
        "median_job_s": round(sorted(o["seconds"] for o in outcomes)[len(outcomes) // 2], 2),
        "wall_s": round(wall, 2),
        **check(args),
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
