"""What the RL stage contributes, per method: the change in training reward from a run's first
steps to its last, with an interval over seeds. The claims compare methods after RL; this says
whether RL itself moved the reward, so that a reader knows what "RL" means in the run. A method
without IML and HSFT learns from the policy gradient alone: where its interval reaches 0, the
policy gradient did not raise the reward within the run's steps, and the methods' differences come
from what else they do (their SFT start, IML's likelihood term, HSFT's SFT updates).
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from meml.plan import grid
from meml.reporting import stats
from meml.reporting.results import Results, cells_average

EDGE_STEPS = 3  # the steps averaged at each end: one step's reward is a handful of questions


def reward_change(results: Results, model: str, ds: str, method: str, seeds: list[int]) -> np.ndarray:
    """seeds x 1: 100 x (mean reward of the last EDGE_STEPS steps - of the first EDGE_STEPS)."""
    values = []
    for seed in seeds:
        rewards = [r["reward/mean"] for r in results.steps(model, ds, method, seed)]
        k = min(EDGE_STEPS, len(rewards) // 2)
        if k == 0:
            values.append([float("nan")])
            continue
        values.append([100 * (statistics.fmean(rewards[-k:]) - statistics.fmean(rewards[:k]))])
    return np.array(values)


def _cell(est: stats.Estimate, level: float) -> str:
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
    steps = max((len(results.steps(models[0], datasets[0], m, seeds[0])) for m in grid.methods(cfg)), default=0)
    k = min(EDGE_STEPS, steps // 2)
    lines = [
        f"What the RL stage contributes: each method's training reward, the mean of its last {k} step(s) "
        f"minus its first {k} (points, of {steps} steps), averaged over {', '.join(models)}; "
        f"{100 * level:.0f}% interval over seeds.",
        "",
        "| method | " + " | ".join(datasets) + " | all |",
        "| --- | " + " | ".join("---" for _ in datasets) + " | --- |",
    ]
    gradient_only: list[tuple[str, stats.Estimate]] = []
    for method in grid.methods(cfg):
        change = {(m, ds): reward_change(results, m, ds, method, seeds) for m in models for ds in datasets}
        per_ds = [cells_average(cfg, models, [change[m, ds] for m in models]) for ds in datasets]
        pooled = cells_average(cfg, models, list(change.values()))
        lines.append(f"| {method} | " + " | ".join(_cell(e, level) for e in [*per_ds, pooled]) + " |")
        switches = cfg["methods"][method]
        if not switches.get("iml") and not switches.get("hsft"):
            gradient_only.append((method, pooled))
    if len(seeds) < 2:
        return [*lines, "", "One seed: no interval, so the table describes and decides nothing."]
    flat = [m for m, e in gradient_only if e.has_interval and e.interval(level)[0] <= 0]
    rising = [m for m, e in gradient_only if e.has_interval and e.interval(level)[0] > 0]
    lines.append("")
    if flat:
        lines.append(
            f"The policy gradient alone ({', '.join(flat)}: no IML, no HSFT) does not raise the training reward "
            f"within these {steps} steps (the interval reaches 0): in this run, differences between methods come "
            "from their SFT start and from IML's and HSFT's supervised terms, not from GRPO's own learning."
        )
    if rising:
        lines.append(f"The policy gradient alone raises the training reward for {', '.join(rising)}.")
    return lines
