"""The README's reproduction table, rendered from the committed study reports: claim | paper | ours
(pooled over the study's independent runs, with its interval) | verdict | recipe | command | time on
2 cores; and the table of what each committed run took and at which commit (config/README.md and
report/example/README.md). Nothing in them is typed by
hand: the claims and their intervals come from the study report's tables/claims.json, the times from
each run's run.json.

    python -m meml.reporting.readme_table            print the tables
    python -m meml.reporting.readme_table --write    put them into README.md, config/README.md and
                                                     report/example/README.md

tests/test_readme.py fails when a copy differs from what this renders.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from meml.core.config import PROJECT_ROOT
from meml.core.io import DataError, atomic_write_text, read_json

STUDY = "toy-study"  # the committed study whose pooled claims the README shows
RECIPE = "config/toy-study.yaml"
COMMAND = "`make study`"
BEGIN = "<!-- reproduction table: python -m meml.reporting.readme_table --write -->"
END = "<!-- end of the reproduction table -->"
TIMES_BEGIN = "<!-- run times: python -m meml.reporting.readme_table --write -->"
TIMES_END = "<!-- end of the run times -->"
EXAMPLE = PROJECT_ROOT / "report" / "example"


def _paper(text: str) -> str:
    """'paper: 69.0 vs 63.4, +5.6' -> '+5.6' (the paper's own difference), else a dash."""
    match = re.search(r", ([+-][0-9.]+)$", text)
    return match.group(1) if match else "–"


def _ours(claim: dict[str, Any]) -> str:
    if claim["low"] is None:
        return f"{claim['difference']:+.1f}"
    return f"{claim['difference']:+.1f} [{claim['low']:+.1f}, {claim['high']:+.1f}]"


def render(example: Path = EXAMPLE) -> str:
    """The table's Markdown, from example/<STUDY>/tables/claims.json and each run's run.json."""
    claims_file = example / STUDY / "tables" / "claims.json"
    if not claims_file.is_file():
        raise DataError("the study report has no claims.json (rebuild it with the report rule)", claims_file)
    claims = read_json(claims_file)
    replication = claims.get("replication")
    if not replication:
        raise DataError("the study report pools no replicate (report.replicates)", claims_file)
    runs = replication["runs"]
    minutes = []
    for profile in runs:
        record = example / profile / "run.json"
        if not record.is_file():
            raise DataError("a study run has no run record", record)
        minutes.append(read_json(record)["wall_seconds"] / 60)
    time = " + ".join(f"{m:.0f}" for m in minutes) + f" min ({len(runs)} runs)"
    level = round(100 * replication["pooled"][0]["level"])
    lines = [
        f"| claim | paper | ours, pooled [{level}% CI] | verdict | recipe | command | time on 2 cores |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for i, claim in enumerate(replication["pooled"]):
        where = (f"`{RECIPE}`", COMMAND, time) if i == 0 else ("″", "″", "″")
        verdict = claim["verdict"].split(" (")[0]
        lines.append(
            f"| {claim['text']} | {_paper(claim['paper'])} | {_ours(claim)} | {verdict} | {' | '.join(where)} |"
        )
    runs_text = " and ".join(f"`report/example/{p}/`" for p in runs)
    lines += [
        "",
        f"Differences in accuracy points (the design: `{RECIPE}`), pooled over {runs_text} with a random "
        "effect for the run; each run's interval covers the other run's estimate "
        f"in {replication['covered']} of {replication['pairs']} (claim, run) pairs. Paper: its own difference "
        "where it reports both methods.",
    ]
    return "\n".join(lines)


def run_times(example: Path = EXAMPLE) -> str:
    """What each committed run took, from its run.json (reports made before run records have none)."""
    lines = [
        "| committed report | wall time | cores | job-seconds | jobs | commit |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for record in sorted(example.glob("*/run.json")):
        run = read_json(record)
        commit = run["commit"][:7] + (" (uncommitted changes)" if run["dirty"] else "")
        if run.get("tables_by"):  # trained at `commit`, its tables rebuilt by a later commit's reporting code
            commit += f", tables by {run['tables_by'][:7]}"
        lines.append(
            f"| `report/example/{record.parent.name}/` | {run['wall_seconds'] / 60:.1f} min | {run['cores']} "
            f"| {run['job_seconds']:.0f} | {sum(run['jobs_by_rule'].values())} | {commit} |"
        )
    return "\n".join(lines)


BLOCKS = {  # file -> (its markers, what renders the block between them)
    "README.md": (BEGIN, END, render),
    "config/README.md": (TIMES_BEGIN, TIMES_END, run_times),
    "report/example/README.md": (TIMES_BEGIN, TIMES_END, run_times),  # which commit made each report
}


def write(root: Path = PROJECT_ROOT) -> list[str]:
    """Replace each block between its file's markers; the files that changed."""
    changed = []
    for name, (begin, end, make) in BLOCKS.items():
        path = root / name
        text = path.read_text()
        if begin not in text or end not in text:
            raise DataError(f"no markers for the generated table ({begin} ... {end})", path)
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        new = f"{head}{begin}\n{make()}\n{end}{tail}"
        if new != text:
            atomic_write_text(path, new)
            changed.append(name)
    return changed


def copy_in(name: str, root: Path = PROJECT_ROOT) -> str:
    """The block as the file holds it now (between its markers)."""
    begin, end, _ = BLOCKS[name]
    return (root / name).read_text().partition(begin)[2].partition(end)[0].strip("\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="put the table into README.md")
    args = parser.parse_args()
    if args.write:
        changed = write()
        print(f"updated: {', '.join(changed)}" if changed else "README.md and config/README.md already up to date")
    else:
        print(render() + "\n\n" + run_times())
