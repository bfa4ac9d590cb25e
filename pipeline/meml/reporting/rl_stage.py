"""What the RL stage contributes, per method: the held-out accuracy of each cell minus that of the SFT
model it started RL from, on the same test questions under the headline expert's prompt, paired by
question, with the study's interval over seeds (learning.py pairs them; results.cells_average pools
data sets and models as the claims do). The claims compare methods after RL; this says what RL
itself added to each, so that a reader knows whether "GRPO beats X" is a statement about RL.

Beside it, the headroom RL had: each SFT start's pass@1 against its pass@k (k the group size, at
RL's sampling) on held-out questions, from the calibration gate. A model that sometimes answers a
question right (pass@k) but usually not (pass@1) is what RLVR can sharpen; where the two are close,
there is little for the policy gradient to find.

The training reward's change from a run's first steps to its last is not a measure of learning
here: one step's reward is a handful of questions, and which questions a step draws moves it as
much as training does. It stays in the reward-curve figures and in trl's side-by-side
(`edge_change`), read as a curve, not as the headline.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np

from meml.core.io import read_json
from meml.plan import grid
from meml.plan.layout import Layout
from meml.reporting import stats
from meml.reporting.learning import paired
from meml.reporting.results import Results, cells_average

EDGE_STEPS = 3  # the fewest steps averaged at each end: one step's reward is a handful of questions


def edge_steps(steps: int) -> int:
    """The steps averaged at each end: EDGE_STEPS, or a tenth of a longer run, at most half of it."""
    return min(max(EDGE_STEPS, steps // 10), steps // 2)


def edge_change(rewards: list[float]) -> stats.Estimate:
    """100 x (the last edge steps' mean reward - the first edge steps'), Welch's interval over those
    steps: one run's reward change (ours, or trl's beside it)."""
    points = [100 * r for r in rewards]
    k = edge_steps(len(points))
    return stats.welch(points[-k:], points[:k]) if k else stats.Estimate(float("nan"), float("nan"), 0.0)


def change_cell(est: stats.Estimate, level: float) -> str:
    """A change with its interval, as a table cell: "+9.4 [-16.4, +35.1]"."""
    if not np.isfinite(est.mean):
        return "–"
    if not est.has_interval:
        return f"{est.mean:+.1f}"
    low, high = est.interval(level)
    return f"{est.mean:+.1f} [{low:+.1f}, {high:+.1f}]"


def heldout_gain(cfg: dict[str, Any], results: Results, datasets: list[str], method: str) -> stats.Estimate:
    """A method's held-out accuracy minus its SFT start's, in points, under the headline expert,
    averaged over the grid's models and `datasets` as the claims average (cells_average)."""
    expert = f"e{cfg['report']['headline_expert']}"
    models = grid.models(cfg)
    cells = []
    for model in models:
        for ds in datasets:
            rl, start = paired(results, model, ds, method, expert)
            cells.append(100 * (rl - start))
    return cells_average(cfg, models, cells)


def verdict(est: stats.Estimate, level: float) -> str:
    """raised | lowered | no clear change, by the interval."""
    if not est.has_interval:
        return "no interval"
    low, high = est.interval(level)
    return "raised" if low > 0 else "lowered" if high < 0 else "no clear change"


def headroom(cfg: dict[str, Any], root: Path) -> list[tuple[str, str, float, float, float, int]]:
    """(data set, SFT variant, greedy, pass@1, pass@k, k): the SFT starts' held-out headroom from the
    calibration files (means over the seeds' models), where the gate measured it."""
    found: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for model, ds, run in grid.calibrated(cfg):
        path = Layout(root).calibration(model, ds, run)
        record = read_json(path) if path.is_file() else {}
        if "heldout" in record:
            variant = run.split("/")[0]
            found.setdefault((ds, variant), []).append(record)
    return [
        (ds, variant,
         100 * statistics.fmean(r["greedy"]["accuracy"] for r in records),
         100 * statistics.fmean(r["heldout"]["pass_at_1"] for r in records),
         100 * statistics.fmean(r["heldout"]["pass_at_k"] for r in records),
         int(records[0]["heldout"]["k"]))
        for (ds, variant), records in sorted(found.items())
    ]  # fmt: skip


def rl_stage_lines(cfg: dict[str, Any], results: Results, root: Path) -> list[str]:
    """Markdown: each method's held-out change over its SFT start (per data set and over all), one
    sentence on what RL did, and the SFT starts' headroom."""
    level = cfg["report"]["stats"]["level"]
    if not cfg["eval"]["sft"]:
        return [
            "What the RL stage contributes: not measured (eval.sft: false). With eval.sft: true every SFT model RL "
            "starts from is evaluated like the cells, and each method's held-out change over its SFT start is "
            "given here, paired by question."
        ]
    datasets, seeds = cfg["grid"]["datasets"], cfg["grid"]["seeds"]
    over = "interval over seeds" if len(seeds) > 1 else "one seed: paired over the test questions alone"
    lines = [
        f"What the RL stage contributes: each method's held-out accuracy (expert {cfg['report']['headline_expert']}'s "
        "prompt) minus that of the SFT model it started RL from, on the same test questions, paired by question "
        f"(points; {100 * level:.0f}% {over}; the learning table has every expert):",
        "",
        "| method | " + " | ".join(datasets) + " | all |",
        "| --- | " + " | ".join("---" for _ in datasets) + " | --- |",
    ]
    by_verdict: dict[str, list[str]] = {}
    for method in grid.methods(cfg):
        per_ds = [heldout_gain(cfg, results, [ds], method) for ds in datasets]
        pooled = heldout_gain(cfg, results, datasets, method)
        lines.append(f"| {method} | " + " | ".join(change_cell(e, level) for e in [*per_ds, pooled]) + " |")
        by_verdict.setdefault(verdict(pooled, level), []).append(method)
    said = {
        "raised": "RL raised held-out accuracy over the SFT start for",
        "lowered": "RL lowered it for",
        "no clear change": "no clear change (the interval reaches 0) for",
    }
    lines += [
        "",
        "; ".join(f"{said[v]} {', '.join(by_verdict[v])}" for v in said if v in by_verdict) + " (over all data sets).",
    ]
    room = headroom(cfg, root)
    if room:
        lines.append(
            "The SFT starts' headroom on held-out questions (the calibration gate, expert "
            f"{cfg['report']['headline_expert']}, mean over seeds): "
            + "; ".join(
                f"{ds} {variant}: greedy {g:.1f}, pass@1 {p1:.1f}, pass@{k} {pk:.1f}"
                for ds, variant, g, p1, pk, k in room
            )
            + ". Pass@k above pass@1 is what RL can turn into pass@1."
        )
    lines.append("The training reward's curve over the steps is in the reward-curve figures.")
    return lines
