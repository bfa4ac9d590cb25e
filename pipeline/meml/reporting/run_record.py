"""report/<profile>/run.json: the facts of the runs that made a report, written by the DAG itself
when it finishes (the Snakefile's onsuccess), so that docs and the README cite a file instead of
retyping minutes.

    {"profile", "commit", "dirty", "machine": {cpu, cpus, platform}, "cores", "versions": {...},
     "seeds": {seed, grid_seeds, seeds_vary},
     "wall_seconds", "job_seconds", "job_seconds_by_rule", "jobs_by_rule",   (sums over invocations)
     "invocations": [{start, end, wall_seconds, jobs, job_seconds_by_rule, commit, dirty}, ...]}

A grid run in parts (stopped and started again) is one record with one invocation a part: the
sums are what the whole run cost, a part that failed or was stopped included (the onerror hook
writes too). An invocation that ran no job (everything up to date) adds nothing. A record older
than the run's results folder (results/<profile>/ made again from scratch) is started afresh.
The commit is the code that finished the run; `dirty` says the working tree differed from it. Each
invocation names its own commit too, since the parts of one run may be run by different code (a
recipe of two commands, the second after a fix to the second's config).
Tables rebuilt later by another commit's reporting code (`meml report` over the same results) add
"tables_by": that commit, so a copy says which code trained it and which wrote its tables.
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from meml.core.environment import cpu_model
from meml.core.io import atomic_write_json, read_json
from meml.core.job_log import finished_jobs
from meml.plan.layout import Layout

PACKAGES = ("torch", "transformers", "trl", "lm_eval", "vllm", "snakemake", "mlflow", "accelerate")


def _git(*args: str) -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, check=False)
        if done.returncode == 0:
            return done.stdout.strip()
    return None


def versions() -> dict[str, str]:
    """Python's and the installed versions of the packages a number depends on (absent: left out)."""
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


def jobs_since(metadata_dir: Path, since: float) -> list[tuple[str, float]]:
    """(rule, seconds) of each job Snakemake recorded as ended since `since` (one record per output
    file: a job with several outputs counts once)."""
    return list(finished_jobs(metadata_dir, since).values())


def invocation(
    start: float, end: float, jobs: list[tuple[str, float]], commit: str | None = None, dirty: bool | None = None
) -> dict[str, Any]:
    by_rule: dict[str, float] = {}
    for rule, seconds in jobs:
        by_rule[rule] = by_rule.get(rule, 0.0) + seconds
    return {
        "start": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start)),
        "end": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(end)),
        "wall_seconds": round(end - start, 1),
        "jobs": len(jobs),
        "jobs_by_rule": {r: sum(1 for rule, _ in jobs if rule == r) for r in sorted(by_rule)},
        "job_seconds_by_rule": {r: round(s, 1) for r, s in sorted(by_rule.items())},
        "commit": commit,
        "dirty": dirty,
    }


def update(
    path: Path,
    cfg: dict[str, Any],
    start: float,
    end: float,
    jobs: list[tuple[str, float]],
    cores: int | None = None,
    fresh_since: float | None = None,
) -> dict[str, Any]:
    """Add this invocation to the record at `path` (a new record, or one of an earlier part of the
    same run) and write it; the sums cover every invocation."""
    record: dict[str, Any] = read_json(path) if path.is_file() else {}
    if fresh_since is not None and record.get("updated", 0) < fresh_since:
        record = {}  # the results were made again from scratch since: another run
    runs = list(record.get("invocations", []))
    head = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no")
    dirty = bool(status) if status is not None else None
    if jobs:
        runs.append(invocation(start, end, jobs, head, dirty))
    by_rule: dict[str, float] = {}
    counts: dict[str, int] = {}
    for run in runs:
        for rule, seconds in run["job_seconds_by_rule"].items():
            by_rule[rule] = by_rule.get(rule, 0.0) + seconds
        for rule, n in run.get("jobs_by_rule", {}).items():
            counts[rule] = counts.get(rule, 0) + n
    record = {
        "profile": cfg["profile"],
        "commit": head,
        "dirty": dirty,
        "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "cores": cores if cores is not None else record.get("cores"),  # what the run was given (--cores)
        "versions": versions(),
        "seeds": {"seed": cfg["seed"], "grid_seeds": cfg["grid"]["seeds"], "seeds_vary": cfg["grid"]["seeds_vary"]},
        "wall_seconds": round(sum(r["wall_seconds"] for r in runs), 1),
        "job_seconds": round(sum(by_rule.values()), 1),
        "job_seconds_by_rule": {r: round(s, 1) for r, s in sorted(by_rule.items())},
        "jobs_by_rule": dict(sorted(counts.items())),
        "invocations": runs,
        "updated": round(end, 1),
    }
    atomic_write_json(path, record)
    return record


def write(cfg: dict[str, Any], state_file: Path, report_dir: Path, cores: int | None = None) -> dict[str, Any] | None:
    """The onsuccess and onerror hook: this invocation's jobs (since the start the progress state
    holds) added to report/<profile>/run.json. Never fails the workflow: a missing state writes
    nothing."""
    with contextlib.suppress(OSError, ValueError, KeyError):
        start = float(read_json(state_file)["start"])
        jobs = jobs_since(Path(".snakemake/metadata"), start)
        marker = Layout.of(cfg).mlflow_marker  # written when the run's results folder is made
        since = marker.stat().st_mtime if marker.is_file() else None
        return update(report_dir / "run.json", cfg, start, time.time(), jobs, cores, since)
    return None


def note_tables_by(report_dir: Path) -> None:
    """Where report_dir holds a run record of another commit than the reporting code's own, record
    the reporting code's commit as `tables_by` (the code's checkout, not the working directory's)."""
    record = Path(report_dir) / "run.json"
    if not record.is_file():
        return
    run = read_json(record)
    code = _git("-C", str(Path(__file__).resolve().parents[3]), "rev-parse", "HEAD")
    if code and run.get("commit") != code and run.get("tables_by") != code:
        atomic_write_json(record, {**run, "tables_by": code})
