"""A study and its replications: the same grid run again from another base seed (`seed`: other toy
data, other pretrained and SFT models, other RL) in a folder of its own, compared claim by claim,
and the runs pooled.

Why: a result counts when a second independent run agrees. Each run is decided on its own page
(Holm over its own tests, as its own report does); the pooled estimate is the mean of the runs'
estimates with their variances added (independent runs: stats.average), decided with
Holm over the pooled page. Two runs that disagree where both intervals are narrow point at
something the intervals leave out; that is the question the table is for.

`report.replicates` names the other runs' profiles; their results must already be on disk
(results/<profile>/eval/...), written by the same grid (a run of the same config with another
`seed` and `profile`). The table is `replication` in the report's tables and a section of its index.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from meml.core.io import DataError
from meml.reporting import stats
from meml.reporting.results import Results
from meml.reporting.summary import Comparison, Summary, decide, load_claims
from meml.reporting.tables import Table


def run_folders(cfg: dict[str, Any], root: Path) -> list[tuple[str, Path]]:
    """(profile, results folder) of this run and of each replicate, beside it."""
    folders = [(cfg["profile"], root)]
    for name in cfg["report"]["replicates"]:
        folder = root.parent / name
        if not folder.is_dir():
            raise DataError(
                f"replicate '{name}' has no results: run the same grid with another seed and profile first",
                folder,
                None,
                "report.replicates",
            )
        folders.append((name, folder))
    return folders


def _pooled(summary: Summary, runs: list[Comparison], measure: str, chance: float) -> Comparison:
    first = runs[0]
    pooled = Comparison(
        first.text, first.a, first.b, first.claim, first.table,
        stats.average([c.estimate for c in runs]),
        (stats.average([c.sides[0] for c in runs]), stats.average([c.sides[1] for c in runs])),
    )  # fmt: skip
    pooled.no_verdict = summary._no_verdict(pooled, chance, measure)
    return pooled


def _cell(c: Comparison, level: float) -> str:
    est = c.estimate
    if not est.has_interval:
        return f"{est.mean:+.1f}"
    lo, hi = est.interval(level)
    return f"{est.mean:+.1f} [{lo:+.1f}, {hi:+.1f}]"


def _word(c: Comparison) -> str:
    return c.verdict.split(" (")[0]  # "inconclusive (this design detects ...)" -> "inconclusive"


def replication(cfg: dict[str, Any], root: Path, reference: dict[str, Any]) -> tuple[Table, list[str]]:
    """The replication table and the index's lines: every claim in each run, then pooled."""
    folders = run_folders(cfg, root)
    summaries = [Summary(cfg, Results(cfg, folder), reference) for _, folder in folders]
    entries = summaries[0].entries(load_claims(cfg["report"]["claims"]))
    per_run = []
    for summary in summaries:
        comparisons = [summary.compare(e) for _, e in entries]
        decide(comparisons, summary.settings)
        per_run.append(comparisons)
    pooled = []
    for i, (_, entry) in enumerate(entries):
        measure = entry.get("measure", "accuracy")
        chance = 0.0 if measure == "final_reward" else _chance(summaries[0], entry)
        pooled.append(_pooled(summaries[0], [run[i] for run in per_run], measure, chance))
    decide(pooled, summaries[0].settings)
    level = summaries[0].settings["level"]
    names = [name for name, _ in folders]
    table = Table(
        "replication",
        f"Replication: each claim in {len(names)} independent runs (other base seed: other data, models and RL) "
        "and pooled",
        ["claim"],
        [
            *((f"run `{n}`", ["difference [95% CI]", "verdict"]) for n in names),
            ("pooled", ["difference [95% CI]", "verdict"]),
            ("", ["runs agree"]),
        ],
    )
    agree = 0
    for i, (_, entry) in enumerate(entries):
        words = [_word(run[i]) for run in per_run]
        same = len(set(words)) == 1
        agree += same
        cells = [x for run in per_run for x in (_cell(run[i], level), _word(run[i]))]
        table.add([entry["text"]], [*cells, _cell(pooled[i], level), _word(pooled[i]), "yes" if same else "no"])
    table.notes.append(
        "Each run decided on its own page (Holm over its own tests); pooled: the runs' estimates averaged, their "
        "variances added (independent runs), Holm over the pooled page. A run's seeds retrain "
        f"{', '.join(cfg['grid']['seeds_vary'])}."
    )
    lines = [
        "",
        f"Replication ({len(names)} independent runs: {', '.join(f'`{n}`' for n in names)}; the replication table): "
        f"{agree} of {len(entries)} claims get the same verdict in every run. Pooled:",
        *(f"- {c.text}: {_cell(c, level)}, **{c.verdict}**." for c in pooled),
    ]
    return table, lines


def _chance(summary: Summary, entry: dict[str, Any]) -> float:
    models, datasets = summary.scope(entry)
    return statistics.fmean(summary.chance(m, ds, entry["a"]) for m in models for ds in datasets)
