"""One line per finished cell, printed by the DAG after each evaluation: the cell's headline
accuracy, jobs done of total, and an estimate of the time left. Light on purpose (json only): it
runs once a cell, outside the worker.

    python -m meml.progress results/<profile>/eval/<cell>.json STATE_FILE

STATE_FILE (written by the Snakefile's onstart) holds the run's start time and job count; the jobs
done are the job records Snakemake wrote since then (.snakemake/metadata).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path


def line(eval_json: Path, state_file: Path, headline: str = "e1") -> str:
    state = json.loads(state_file.read_text())
    metadata = Path(".snakemake/metadata")
    finished = set()  # one record per output file: count the jobs (job_hash) once each
    if metadata.is_dir():
        for path in metadata.iterdir():
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if (record.get("endtime") or 0) >= state["start"]:
                finished.add(record.get("job_hash", path.name))
    done = len(finished) + 1  # and this cell's evaluation, whose record Snakemake writes after this line
    elapsed = time.time() - state["start"]
    left = elapsed / done * max(state["total"] - done, 0)
    block = json.loads(eval_json.read_text())["model"]
    expert = block["experts"].get(headline) or next(iter(block["experts"].values()))
    cell = "/".join(eval_json.with_suffix("").parts[-4:])
    return (
        f"[meml] {min(done, state['total'])}/{state['total']} jobs, about {left / 60:.0f} min left | "
        f"{cell}: expert {headline[1:]} {100 * expert['lenient']:.1f}% (lenient)"
    )


if __name__ == "__main__":
    with contextlib.suppress(OSError, ValueError, KeyError, IndexError):  # never worth failing a job for
        print(line(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "e1"), file=sys.stderr)
