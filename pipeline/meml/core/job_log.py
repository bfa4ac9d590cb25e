"""The jobs a Snakemake run has finished, read from its job records (.snakemake/metadata): what the
progress line's time left and the run record (report/<profile>/run.json) are computed from. Light
on purpose (json only): the progress line runs once a cell, outside the worker."""

from __future__ import annotations

import json
from pathlib import Path


def finished_jobs(metadata: Path, since: float) -> dict[str, tuple[str, float]]:
    """job hash -> (rule, seconds) of the jobs Snakemake recorded as ended since `since` (one record
    per output file: a job with several outputs is counted once)."""
    jobs: dict[str, tuple[str, float]] = {}
    if metadata.is_dir():
        for path in metadata.iterdir():
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            end, begin = record.get("endtime") or 0, record.get("starttime") or 0
            if end >= since:
                jobs[record.get("job_hash", path.name)] = (str(record.get("rule")), max(end - begin, 0.0))
    return jobs
