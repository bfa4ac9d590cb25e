"""The README's reproduction table, rendered from the committed study reports: claim | paper | ours
(pooled over the study's independent runs, with its interval) | verdict | recipe | command | time on
2 cores; and the table of what each committed run took and at which commit (config/README.md and
report/example/README.md). Nothing in them is typed by
hand: the claims and their intervals come from the study report's tables/claims.json, the times from
each run's run.json.

    python -m meml.reporting.readme_table            print the tables
    python -m meml.reporting.readme_table --write    put them into README.md, config/README.md and
                                                     report/example/README.md

and the README's line on a real model trained long enough to show what RL does, from the committed
report/example/real-learn/ (its tables/learning.json, tables/trl.json and run.json).

tests/test_readme.py fails when a copy differs from what this renders.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from meml.core.config import PROJECT_ROOT
from meml.core.io import DataError, atomic_write_text, read_json
from meml.reporting.tables import DATASET_TITLES
from meml.reporting.trl_table import ENGINE_NAMES

STUDY = "toy-study"  # the committed study whose pooled claims the README shows
RECIPE = "config/toy-study.yaml"
COMMAND = "`make study`"
BEGIN = "<!-- reproduction table: python -m meml.reporting.readme_table --write -->"
END = "<!-- end of the reproduction table -->"
REAL = "real-learn"  # the committed run of a real model trained long enough to show what RL does
REAL_RECIPE = "config/real-learn.yaml"
REAL_BEGIN = "<!-- real model: python -m meml.reporting.readme_table --write -->"
REAL_END = "<!-- end of the real model -->"
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


def _reading(cell: dict[str, Any]) -> str:
    """What a cell's difference from its SFT start says, by its interval and the chance level."""
    if cell["low"] is None:
        return "no interval"
    if max(cell["accuracy"], cell["sft_accuracy"]) <= cell["chance"]:
        return "both at or below chance"
    if cell["low"] > 0:
        return "above its SFT start"
    if cell["high"] < 0:
        return "below its SFT start"
    return "no clear change"


def render_real(example: Path = EXAMPLE) -> str:
    """The README's line on a real model, from example/<REAL>/tables/{learning,trl}.json and its run.json."""
    folder = example / REAL
    learning_file = folder / "tables" / "learning.json"
    if not learning_file.is_file():
        raise DataError("the real model's report has no learning.json (its recipe sets eval.sft)", learning_file)
    headline = [c for c in read_json(learning_file)["cells"] if c["expert"] == "e1"]
    if not headline:
        raise DataError("no cell evaluated under expert 1's prompt", learning_file)
    first = headline[0]
    parts = [
        f"{c['method']} {c['accuracy']:.1f}% against {c['sft_accuracy']:.1f}%, {_ours(c)} ({_reading(c)})"
        for c in headline
    ]
    level = round(100 * first["level"])
    record = folder / "run.json"
    run = read_json(record) if record.is_file() else {}
    title = DATASET_TITLES[first["dataset"]]
    # a run that generated the toy world trained on its synthetic problems (run.json counts its jobs)
    if "toy_world" in (run.get("jobs_by_rule") or {}):
        task = f"{first['questions']} held-out synthetic {title}-format problems (the toy world's)"
    else:
        task = f"{first['questions']} real {title} test questions"
    text = (
        f"A real model: SmolLM2-135M-Instruct on {task} "
        f"(`{REAL_RECIPE}`, `report/example/{REAL}/`), held-out accuracy under expert 1's prompt after "
        f"{first['rl_steps']} RL steps against the SFT model it started from, paired by question [{level}% CI]: "
        + "; ".join(parts)
        + f". A constant answer scores {first['chance']:.1f}%."
    )
    trl_file = folder / "tables" / "trl.json"
    if trl_file.is_file():
        for c in read_json(trl_file)["cells"]:
            who = "our loop" if c["faster"] == "ours" else "trl's GRPOTrainer"
            ours, theirs = (ENGINE_NAMES[c["engines"][side]] for side in ("ours", "trl"))
            text += (
                f" On {c['method']}'s cell beside trl's GRPOTrainer (same start, questions, reward and settings; "
                f"rollouts by {ours} in ours, {theirs} in trl's), "
                f"{who} ran {c['ratio']:.2f}x faster a step ({c['step_seconds']['ours']:.0f} s against "
                f"{c['step_seconds']['trl']:.0f} s), held-out ours minus trl's {_ours(c)}."
            )
    if run:
        minutes = " + ".join(f"{r['wall_seconds'] / 60:.0f}" for r in run.get("invocations", []))
        text += f" Time on {run['cores']} cores, one figure a command: {minutes} min (its run.json)."
    return text


def run_times(example: Path = EXAMPLE) -> str:
    """What each committed run took, from its run.json (reports made before run records have none)."""
    lines = [
        "| committed report | wall time | cores | job-seconds | jobs | commit |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for record in sorted(example.glob("*/run.json")):
        run = read_json(record)
        # a run in parts by different code (a recipe's two commands) names each part's commit, in order
        parts = [(r["commit"], r["dirty"]) for r in run.get("invocations", []) if r.get("commit")]
        if len({c for c, _ in parts}) < 2:
            parts = [(run["commit"], run["dirty"])]
        commit = " + ".join(c[:7] + (" (uncommitted changes)" if dirty else "") for c, dirty in parts)
        if run.get("tables_by"):  # trained at `commit`, its tables rebuilt by a later commit's reporting code
            commit += f", tables by {run['tables_by'][:7]}"
        lines.append(
            f"| `report/example/{record.parent.name}/` | {run['wall_seconds'] / 60:.1f} min | {run['cores']} "
            f"| {run['job_seconds']:.0f} | {sum(run['jobs_by_rule'].values())} | {commit} |"
        )
    return "\n".join(lines)


BLOCKS = {  # file -> (its markers, what renders the block between them)
    "README.md": (BEGIN, END, render),
    "README.md#real": (REAL_BEGIN, REAL_END, render_real),
    "config/README.md": (TIMES_BEGIN, TIMES_END, run_times),
    "report/example/README.md": (TIMES_BEGIN, TIMES_END, run_times),  # which commit made each report
}


def write(root: Path = PROJECT_ROOT) -> list[str]:
    """Replace each block between its file's markers; the files that changed."""
    changed = []
    for name, (begin, end, make) in BLOCKS.items():
        path = root / name.partition("#")[0]  # a file may hold several blocks
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
    return (root / name.partition("#")[0]).read_text().partition(begin)[2].partition(end)[0].strip("\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="put the table into README.md")
    args = parser.parse_args()
    if args.write:
        changed = write()
        print(f"updated: {', '.join(changed)}" if changed else "README.md and config/README.md already up to date")
    else:
        print(render() + "\n\n" + render_real() + "\n\n" + run_times())
