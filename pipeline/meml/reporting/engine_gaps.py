"""Is the engine that samples the policy that learns? The two checks every RL step logs, over a whole
run, for every cell that logged them:

    sampler gap   |engine log p - learner log p| over the tokens the engine drew, at the weights that
                  drew them (training/rl.sampler_gap): round-off when the learner scores the sampler's
                  own distribution; a temperature, mask or position the learner gets wrong shows as a
                  gap of the order of a logit, at every step
    sync gap      the weight sync's probe (the vLLM engine: training/rollout_vllm.verify): the largest
                  log-prob gap on a fixed probe once the policy's weights are pushed into the engine;
                  a sync that drifts grows it from step to step

A one-step run shows neither defect; a run of many steps shows both, here as a table (per cell) and
a figure (each gap against step, log scale).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from meml.plan import grid
from meml.reporting.results import Results
from meml.reporting.tables import DATASET_TITLES, MISSING, Table, model_label

SAMPLER, SYNC = ("sampler_gap/mean", "sampler_gap/max"), "sync/logprob_gap"
EDGE = 10  # steps averaged at each end of a run to see a drift of the sync gap


def logged(cfg: dict[str, Any], results: Results) -> list[tuple[grid.Cell, list[dict[str, float]]]]:
    """(cell, its steps) of every cell whose steps carry a sampler or sync gap."""
    found = []
    for cell in grid.cells(cfg):
        steps = results.steps(cell.model, cell.dataset, cell.method, cell.seed)
        if any(SAMPLER[0] in s or SYNC in s for s in steps):
            found.append((cell, steps))
    return found


def _sci(x: float) -> str:
    return f"{x:.1e}"


def _drift(gaps: list[float]) -> tuple[float, float]:
    """(mean of the first EDGE gaps, of the last EDGE): a sync that drifts makes the second larger."""
    k = min(EDGE, len(gaps) // 2) or 1
    return statistics.fmean(gaps[:k]), statistics.fmean(gaps[-k:])


def gaps_table(cfg: dict[str, Any], found: list[tuple[grid.Cell, list[dict[str, float]]]]) -> tuple[Table, list[str]]:
    """The table and the index's lines."""
    table = Table(
        "engine_gaps",
        "The sampler against the learner, and the weight sync, at every RL step",
        ["model", "data set", "method"],
        [("sampler gap (nats)", ["steps", "mean", "largest"]),
         ("weight sync probe (nats)", ["syncs", "smallest", "largest", f"first {EDGE} -> last {EDGE}"])],
    )  # fmt: skip
    lines = []
    for cell, steps in found:
        means = [s[SAMPLER[0]] for s in steps if SAMPLER[0] in s]
        tops = [s[SAMPLER[1]] for s in steps if SAMPLER[1] in s]
        syncs = [s[SYNC] for s in steps if SYNC in s]
        sampler = [str(len(means)), _sci(statistics.fmean(means)), _sci(max(tops))] if means else [MISSING] * 3
        if syncs:
            first, last = _drift(syncs)
            sync = [str(len(syncs)), _sci(min(syncs)), _sci(max(syncs)), f"{_sci(first)} -> {_sci(last)}"]
        else:
            sync = [MISSING] * 4
        table.add([model_label(cfg, cell.model), DATASET_TITLES[cell.dataset], f"{cell.method} (seed {cell.seed})"],
                  sampler + sync)  # fmt: skip
        text = f"- {cell.model}/{cell.dataset}/{cell.method} seed {cell.seed}:"
        if means:
            text += (f" the sampler's log-probs against the learner's, over {len(means)} steps: "
                     f"{_sci(statistics.fmean(means))} on average, {_sci(max(tops))} at most;")  # fmt: skip
        if syncs:
            text += (f" the weight sync's probe gap {_sci(min(syncs))} to {_sci(max(syncs))} over {len(syncs)} syncs"
                     f" (first {EDGE} {_sci(first)}, last {EDGE} {_sci(last)}).")  # fmt: skip
        lines.append(text.rstrip(";") + ("" if text.endswith(".") else "."))
    table.notes = [
        "sampler gap: |engine log p - learner log p| over every token the engine drew, the learner scoring the same "
        "weights before the update (mean over a step's tokens, averaged over steps; the largest token anywhere). "
        "weight sync probe: after each step's weights are pushed into the engine, the largest log-prob gap on a "
        "fixed probe (vLLM only). Round-off is about 1e-6 to 1e-4 in float32; a mis-scored temperature, mask or "
        "position shows as about 0.1 or more at every step, a drifting sync as a growing probe gap."
    ]
    return table, lines


def gaps_figure(cfg: dict[str, Any], found: list[tuple[grid.Cell, list[dict[str, float]]]], out: Path) -> list[Path]:
    from meml.reporting.figures import _pyplot, _save

    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4), sharey=True)
    for cell, steps in found:
        label = f"{cell.method} ({cell.dataset}, seed {cell.seed})"
        points = [(s.get("step", i + 1), s) for i, s in enumerate(steps)]
        sampled = [(x, s[SAMPLER[0]]) for x, s in points if SAMPLER[0] in s]
        if sampled:
            left.plot(*zip(*sampled, strict=True), lw=1.1, label=label)
        synced = [(x, s[SYNC]) for x, s in points if SYNC in s]
        if synced:
            right.plot(*zip(*synced, strict=True), lw=1.1, label=label)
    left.set(xlabel="RL step", ylabel="log-prob gap (nats)", yscale="log", title="sampler vs learner (mean)")
    right.set(xlabel="RL step", yscale="log", title="weight sync probe (largest)")
    left.legend(fontsize=7)
    return _save(fig, cfg, "The engine's log-probs against the policy's, every step", out / "engine_gaps")
