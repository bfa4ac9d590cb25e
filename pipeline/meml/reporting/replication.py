"""A study and its replications: the same grid run again from another base seed (`seed`: other toy
data, other pretrained and SFT models, other RL) in a folder of its own, compared claim by claim,
and the runs pooled with a random effect for the run.

Why: a result counts when a second independent run agrees. Each run is decided on its own page
(Holm over its own tests, as its own report does); the pooled estimate combines the runs with
a random effect for the run (stats.random_effects: DerSimonian and Laird), so that a spread between
runs beyond their own intervals widens the pooled interval instead of being averaged away; it is
decided with Holm over the pooled page. The table gives, per claim, the z of the two runs'
difference, the between-run sd tau and I2, and how often each run's interval covers the other's
estimate. Two runs that disagree where both intervals are narrow point at
something the intervals leave out; that is the question the table is for.

`report.replicates` names the other runs' profiles; their results must already be on disk
(results/<profile>/eval/...), written by the same grid (a run of the same config with another
`seed` and `profile`): a replicate whose RL cells were trained with other values (their cell.json)
is refused by name. The table is `replication` in the report's tables and a section of its index.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from meml.core.io import DataError
from meml.plan.grid import cells
from meml.plan.layout import Layout
from meml.reporting import stats
from meml.reporting.results import Results
from meml.reporting.summary import Comparison, Summary, as_record, decide, load_claims
from meml.reporting.tables import Table


def run_folders(cfg: dict[str, Any], root: Path) -> list[tuple[str, Path]]:
    """(profile, results folder) of this run and of each replicate, beside it."""
    folders = [(cfg["profile"], root)]
    for name in cfg["report"]["replicates"]:
        if name == cfg["profile"]:  # the study's list names every run, this one too
            continue
        folder = root.parent / name
        if not folder.is_dir():
            raise DataError(
                f"replicate '{name}' has no results: run the same grid with another seed and profile first",
                folder,
                None,
                "report.replicates",
            )
        check_same_design(cfg, root, name, folder)
        folders.append((name, folder))
    return folders


def check_same_design(cfg: dict[str, Any], root: Path, name: str, folder: Path) -> None:
    """A replicate is this config run again from another base seed: each RL cell's values
    (cell.json: everything that defines its result but the base seed) must equal this run's. A copy
    of a study's recipe with one key changed would otherwise pool the old runs into the new report."""
    for cell in cells(cfg):
        mine, theirs = Layout(root).rl(cell) / "cell.json", Layout(folder).rl(cell) / "cell.json"
        if not (mine.is_file() and theirs.is_file()):
            continue
        a, b = json.loads(mine.read_text()), json.loads(theirs.read_text())
        if a != b:
            keys = ", ".join(sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k)))
            raise DataError(
                f"replicate '{name}' is not this grid run again: its cell {cell.path} was trained with other "
                f"values ({keys}); a replicate is the same config with another `seed` and `profile` (remove it "
                "from report.replicates, or run it again with this config)",
                theirs,
                None,
                "report.replicates",
            )


def _pooled(summary: Summary, runs: list[Comparison], measure: str, chance: float) -> tuple[Comparison, stats.Pooled]:
    """The runs' comparisons pooled with a random effect for the run (stats.random_effects)."""
    first = runs[0]
    combined = stats.random_effects([c.estimate for c in runs])
    sides = tuple(stats.random_effects([c.sides[i] for c in runs]).estimate for i in (0, 1))
    pooled = Comparison(first.text, first.a, first.b, first.claim, first.table, combined.estimate, sides)  # type: ignore[arg-type]
    pooled.paper = first.paper  # the paper's own difference, the same for every run
    pooled.no_verdict = summary._no_verdict(pooled, chance, measure)
    return pooled, combined


def covered_pairs(runs: list[Comparison], level: float) -> tuple[int, int]:
    """(pairs whose interval covers the other run's estimate, pairs): every run's interval against
    every other run's estimate. Right intervals cover a replica's estimate about 83% of the time
    (two runs of equal error differ by sqrt(2) standard errors)."""
    covered = pairs = 0
    for i, own in enumerate(runs):
        if not own.estimate.has_interval:
            continue
        lo, hi = own.estimate.interval(level)
        for j, other in enumerate(runs):
            if i != j:
                pairs += 1
                covered += lo <= other.estimate.mean <= hi
    return covered, pairs


def _cell(c: Comparison, level: float) -> str:
    est = c.estimate
    if not est.has_interval:
        return f"{est.mean:+.1f}"
    lo, hi = est.interval(level)
    return f"{est.mean:+.1f} [{lo:+.1f}, {hi:+.1f}]"


def _word(c: Comparison) -> str:
    return c.verdict.split(" (")[0]  # "inconclusive (this design detects ...)" -> "inconclusive"


def replication(cfg: dict[str, Any], root: Path, reference: dict[str, Any]) -> tuple[Table, list[str], dict[str, Any]]:
    """The replication table, the index's lines, and the record for claims.json: every claim in
    each run, then pooled."""
    folders = run_folders(cfg, root)
    summaries = [Summary(cfg, Results(cfg, folder), reference) for _, folder in folders]
    entries = summaries[0].entries(load_claims(cfg["report"]["claims"]))
    per_run = []
    for summary in summaries:
        comparisons = [summary.compare(e) for _, e in entries]
        decide(comparisons, summary.settings)
        per_run.append(comparisons)
    pooled, combined = [], []
    for i, (_, entry) in enumerate(entries):
        measure = entry.get("measure", "accuracy")
        chance = 0.0 if measure == "final_reward" else _chance(summaries[0], entry)
        comparison, pool = _pooled(summaries[0], [run[i] for run in per_run], measure, chance)
        pooled.append(comparison)
        combined.append(pool)
    decide(pooled, summaries[0].settings)
    level = summaries[0].settings["level"]
    names = [name for name, _ in folders]
    between = ["z of the difference"] if len(names) == 2 else []
    table = Table(
        "replication",
        f"Replication: each claim in {len(names)} independent runs (other base seed: other data, models and RL) "
        "and pooled with a random effect for the run",
        ["claim"],
        [
            *((f"run `{n}`", ["difference [95% CI]", "verdict"]) for n in names),
            ("pooled", ["difference [95% CI]", "verdict"]),
            ("between runs", [*between, "tau", "I2 %", "covers", "runs agree"]),
        ],
    )
    # z of the two runs' difference, per claim (two runs only)
    zs = [stats.difference_z(a.estimate, b.estimate) for a, b in zip(*per_run[:2], strict=True)] if between else []
    agree = covered = pairs = 0
    for i, (_, entry) in enumerate(entries):
        runs = [run[i] for run in per_run]
        words = [_word(c) for c in runs]
        same = len(set(words)) == 1
        agree += same
        hits, n = covered_pairs(runs, level)
        covered, pairs = covered + hits, pairs + n
        z = [f"{zs[i]:+.1f}"] if between else []
        pool = combined[i]
        cells = [x for c in runs for x in (_cell(c, level), _word(c))]
        table.add(
            [entry["text"]],
            [*cells, _cell(pooled[i], level), _word(pooled[i]), *z, f"{pool.tau:.1f}", f"{100 * pool.i2:.0f}",
             f"{hits} of {n}", "yes" if same else "no"],
        )  # fmt: skip
    z2 = sum(z * z for z in zs)
    table.notes += [
        "Each run decided on its own page (Holm over its own tests). Pooled: DerSimonian-Laird random effects "
        "(tau: the between-run sd beyond the runs' own errors; I2: its share of the spread between runs), "
        "Satterthwaite df, Holm over the pooled page; with two runs tau rests on one degree of freedom, so where "
        "it is above 0 the pooled interval is wide. covers: the runs' intervals that hold the other run's "
        "estimate (about 83% expected when the intervals are right). A run's seeds retrain "
        f"{', '.join(cfg['grid']['seeds_vary'])}.",
    ]
    if between:
        table.notes.append(
            "z of the difference: (run 1 - run 2) / sqrt(se1^2 + se2^2); about N(0, 1) when each interval covers "
            "what a replication draws."
        )
    heterogeneous = sum(p.p_heterogeneity < 1 - level for p in combined)
    lines = [
        "",
        f"Replication ({len(names)} independent runs: {', '.join(f'`{n}`' for n in names)}; the replication table): "
        f"{agree} of {len(entries)} claims get the same verdict in every run; each run's interval covers the other "
        f"run's estimate in {covered} of {pairs} (claim, run) pairs (about 83% expected);"
        + (f" sum of z^2 {z2:.1f} over {len(entries)} claims;" if between else "")
        + f" heterogeneity between runs (Cochran's Q, p < {1 - level:.2f}) in {heterogeneous} of {len(entries)} "
        "claims. Pooled with a random effect for the run:",
        *(f"- {c.text}: {_cell(c, level)}, **{c.verdict}**." for c in pooled),
    ]
    record = {
        "runs": names,
        "covered": covered,
        "pairs": pairs,
        "pooled": [
            {**as_record(c, level), "tau": pool.tau, "i2": pool.i2, "p_heterogeneity": pool.p_heterogeneity,
             "z": zs[i] if between else None}
            for i, (c, pool) in enumerate(zip(pooled, combined, strict=True))
        ],
    }  # fmt: skip
    return table, lines, record


def _chance(summary: Summary, entry: dict[str, Any]) -> float:
    models, datasets = summary.scope(entry)
    return statistics.fmean(summary.results.chance(m, ds, entry["a"]) for m in models for ds in datasets)
