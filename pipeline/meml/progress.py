"""One line per finished cell, printed by the DAG after each evaluation: the cell's headline
accuracy, jobs done of total, and an estimate of the time left. Light on purpose (json only): it
runs once a cell, outside the worker.

    python -m meml.progress results/<profile>/eval/<cell>.json STATE_FILE

STATE_FILE (written when the run starts: lifecycle.start) holds the run's start time, its job count and the
jobs of each rule; the jobs done are the job records Snakemake wrote since then
(.snakemake/metadata), with their rule and duration: the time left is what the remaining jobs of
each rule cost at that rule's pace so far (time_left).
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from meml.core.job_log import finished_jobs


def time_left(state: dict[str, Any], finished: dict[str, tuple[str, float]], now: float) -> float:
    """Seconds left: each rule's remaining jobs at that rule's mean duration so far (a rule with no
    finished job yet: the mean of all), divided by the concurrency seen so far (job-seconds per
    second). Jobs differ by orders of magnitude (a pretraining against an evaluation), so counting
    jobs alone (elapsed / done x left) said 11 minutes with six short jobs to go."""
    if not finished:
        return math.nan
    by_rule: dict[str, list[float]] = {}
    for rule, seconds in finished.values():
        by_rule.setdefault(rule, []).append(seconds)
    everything = [s for values in by_rule.values() for s in values]
    overall = sum(everything) / len(everything)
    work = 0.0
    for rule, total in (state.get("rules") or {"?": state["total"]}).items():
        done = by_rule.get(rule, [])
        mean = sum(done) / len(done) if done else overall
        work += max(total - len(done), 0) * mean
    concurrency = sum(everything) / max(now - state["start"], 1e-9)
    return work / max(concurrency, 1e-9)


def line(eval_json: Path, state_file: Path, headline: str = "e1", now: float | None = None) -> str:
    state = json.loads(state_file.read_text())
    now = time.time() if now is None else now
    finished = finished_jobs(Path(".snakemake/metadata"), state["start"])
    done = len(finished) + 1  # and this cell's evaluation, whose record Snakemake writes after this line
    left = time_left(state, finished, now)
    block = json.loads(eval_json.read_text())["model"]
    expert = block["experts"].get(headline) or next(iter(block["experts"].values()))
    cell = "/".join(eval_json.with_suffix("").parts[-4:])
    eta = "" if math.isnan(left) else f", about {left / 60:.0f} min left"
    return (
        f"[meml] {min(done, state['total'])}/{state['total']} jobs{eta} | "
        f"{cell}: expert {headline[1:]} {100 * expert['lenient']:.1f}% (lenient)"
    )


if __name__ == "__main__":
    with contextlib.suppress(OSError, ValueError, KeyError, IndexError):  # never worth failing a job for
        print(line(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "e1"), file=sys.stderr)
