"""What the RL stage contributes, per method: the change in training reward from a run's first
steps to its last, with an interval over seeds. The claims compare methods after RL; this says
whether RL itself moved the reward, so that a reader knows what "RL" means in the run. A method
without IML and HSFT learns from the policy gradient alone: where its interval reaches 0, the
policy gradient did not raise the reward within the run's steps, and the methods' differences come
from what else they do (their SFT start, IML's likelihood term, HSFT's SFT updates).

With one seed there is no spread over runs; the interval is then Welch's over the edge steps' own
rewards (each a mean over one step's questions and rollouts): it says whether this run's reward
moved beyond its step-to-step noise, not whether another run would move as much.
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from meml.plan import grid
from meml.reporting import stats
from meml.reporting.results import Results, cells_average

EDGE_STEPS = 3  # the fewest steps averaged at each end: one step's reward is a handful of questions


def edge_steps(steps: int) -> int:
    """The steps averaged at each end: EDGE_STEPS, or a tenth of a longer run, at most half of it."""
    return min(max(EDGE_STEPS, steps // 10), steps // 2)


def reward_change(results: Results, model: str, ds: str, method: str, seeds: list[int]) -> np.ndarray:
    """seeds x 1: 100 x (mean reward of the last EDGE_STEPS steps - of the first EDGE_STEPS)."""
    values = []
    for seed in seeds:
        rewards = [r["reward/mean"] for r in results.steps(model, ds, method, seed)]
        k = edge_steps(len(rewards))
        if k == 0:
            values.append([float("nan")])
            continue
        values.append([100 * (statistics.fmean(rewards[-k:]) - statistics.fmean(rewards[:k]))])
    return np.array(values)


def edge_change(rewards: list[float]) -> stats.Estimate:
    """100 x (the last edge steps' mean reward - the first edge steps'), Welch's interval over those
    steps: one run's reward change (ours, or trl's beside it)."""
    points = [100 * r for r in rewards]
    k = edge_steps(len(points))
    return stats.welch(points[-k:], points[:k]) if k else stats.Estimate(float("nan"), float("nan"), 0.0)


def one_run_change(results: Results, model: str, ds: str, method: str, seed: int) -> stats.Estimate:
    return edge_change([r["reward/mean"] for r in results.steps(model, ds, method, seed)])


def change_estimate(cfg: dict[str, Any], results: Results, datasets: list[str], method: str) -> stats.Estimate:
    """The reward change of a method averaged over the grid's models and `datasets`: interval over
    seeds, or with one seed over the edge steps of each run (the runs' estimates averaged)."""
    seeds, models = cfg["grid"]["seeds"], grid.models(cfg)
    if len(seeds) == 1:
        return stats.average([one_run_change(results, m, ds, method, seeds[0]) for m in models for ds in datasets])
    return cells_average(cfg, models, [reward_change(results, m, ds, method, seeds) for m in models for ds in datasets])


def change_cell(est: stats.Estimate, level: float) -> str:
    """A change with its interval, as a table cell: "+9.4 [-16.4, +35.1]"."""
    if not np.isfinite(est.mean):
        return "–"
    if not est.has_interval:
        return f"{est.mean:+.1f}"
    low, high = est.interval(level)
    return f"{est.mean:+.1f} [{low:+.1f}, {high:+.1f}]"


def rl_stage_lines(cfg: dict[str, Any], results: Results) -> list[str]:
    """Markdown: the table of reward changes (per data set and over all), and one sentence on the
    methods that learn from the policy gradient alone."""
    level = cfg["report"]["stats"]["level"]
    seeds, models, datasets = cfg["grid"]["seeds"], grid.models(cfg), cfg["grid"]["datasets"]
    run_steps = {ds: max(len(results.steps(models[0], ds, m, seeds[0])) for m in grid.methods(cfg)) for ds in datasets}
    steps = max(run_steps.values(), default=0)
    over = "interval over seeds" if len(seeds) > 1 else "one seed: Welch's interval over those steps' rewards"
    if len(set(run_steps.values())) == 1:
        k = edge_steps(steps)
        ends = f"the mean of its last {k} step(s) minus its first {k} (points, of {steps} steps)"
    else:  # data sets of different lengths (rl_by_dataset): each run's own ends
        per = ", ".join(f"{ds} {edge_steps(n)} of {n}" for ds, n in run_steps.items())
        ends = f"the mean of its last k steps minus its first k (points; k of the steps: {per})"
    lines = [
        f"What the RL stage contributes: each method's training reward, {ends}, averaged over "
        f"{', '.join(models)}; {100 * level:.0f}% {over}.",
        "",
        "| method | " + " | ".join(datasets) + " | all |",
        "| --- | " + " | ".join("---" for _ in datasets) + " | --- |",
    ]
    gradient_only: list[tuple[str, stats.Estimate]] = []
    for method in grid.methods(cfg):
        per_ds = [change_estimate(cfg, results, [ds], method) for ds in datasets]
        pooled = change_estimate(cfg, results, datasets, method)
        lines.append(f"| {method} | " + " | ".join(change_cell(e, level) for e in [*per_ds, pooled]) + " |")
        switches = cfg["methods"][method]
        if not switches.get("iml") and not switches.get("hsft"):
            gradient_only.append((method, pooled))
    within = "" if len(seeds) > 1 else " (within this one run: another run may move otherwise)"
    bounds = [(m, e.interval(level)) for m, e in gradient_only if e.has_interval]
    flat = [m for m, (low, high) in bounds if low <= 0 <= high]
    rising = [m for m, (low, _) in bounds if low > 0]
    falling = [m for m, (_, high) in bounds if high < 0]
    lines.append("")
    if flat or falling:
        moved = f"does not raise the training reward within these {steps} steps (the interval reaches 0)"
        if falling and not flat:
            moved = f"lowers the training reward within these {steps} steps (the interval lies below 0)"
        elif falling:
            moved += f"; for {', '.join(falling)} it falls (the interval lies below 0)"
        lines.append(
            f"The policy gradient alone ({', '.join(flat + falling)}: no IML, no HSFT) {moved}{within}: in this run, "
            "differences between methods come from their SFT start and from IML's and HSFT's supervised terms, not "
            "from GRPO's own learning."
        )
    if rising:
        lines.append(f"The policy gradient alone raises the training reward for {', '.join(rising)}{within}.")
    if len(seeds) > 1:
        lines.append(
            "A seed's steps draw the same questions for every method (the question order is the seed's), so a hard "
            "batch at either end moves every method's change alike; the differences between methods' changes are "
            "free of it."
        )
    return lines
