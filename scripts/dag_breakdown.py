"""Where a Snakemake run's time went: per rule, the number of jobs, mean and total seconds, from
Snakemake's own job records (.snakemake/metadata: start and end time of every output's job).

    .venv/bin/python scripts/dag_breakdown.py [--dir FOLDER]   # the folder snakemake ran in

Wall time is the span from the first job's start to the last job's end; with --cores 2 the jobs'
seconds add up to about twice that.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path


def jobs(folder: Path) -> dict[int, tuple[str, float, float]]:
    """job hash -> (rule, start, end), once per job (a job with several outputs has one record each)."""
    out: dict[int, tuple[str, float, float]] = {}
    for path in (folder / ".snakemake" / "metadata").iterdir():
        record = json.loads(path.read_text())
        if record.get("starttime") and record.get("endtime") and not record.get("incomplete"):
            out[record["job_hash"]] = (record["rule"], float(record["starttime"]), float(record["endtime"]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=".", help="the folder snakemake ran in (holds .snakemake/)")
    parser.add_argument("--since", type=float, default=0.0, help="only jobs started at or after this Unix time")
    args = parser.parse_args()
    records = {k: v for k, v in jobs(Path(args.dir)).items() if v[1] >= args.since}
    if not records:
        raise SystemExit("no finished jobs recorded in .snakemake/metadata")
    by_rule: dict[str, list[float]] = defaultdict(list)
    for rule, start, end in records.values():
        by_rule[rule].append(end - start)
    wall = max(e for _, _, e in records.values()) - min(s for _, s, _ in records.values())
    total = sum(sum(v) for v in by_rule.values())
    print(f"{len(records)} jobs, wall {wall:.0f} s (first start to last end), job-seconds {total:.0f}\n")
    print("| rule | jobs | mean s | total s | share |\n| --- | --- | --- | --- | --- |")
    for rule, seconds in sorted(by_rule.items(), key=lambda kv: -sum(kv[1])):
        print(f"| {rule} | {len(seconds)} | {statistics.fmean(seconds):.1f} | {sum(seconds):.0f} | "
              f"{100 * sum(seconds) / total:.0f}% |")  # fmt: skip


if __name__ == "__main__":
    main()
