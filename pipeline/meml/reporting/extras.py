"""The questions the paper leaves open, as extra tables.

Extra methods (config `extras.methods`) run on extras.models x extras.datasets x grid.seeds; a
method appears in an extra table when its `tables` list names it (the paper's methods carry the
tags too, so MEML-GRPO and its baselines sit in the same rows). Every cell is the headline
expert's accuracy, mean ± sd over seeds, with the per-seed values beside it. The comparisons
between these methods, with intervals and verdicts, are the summary's (summary.py).
"""

from __future__ import annotations

import statistics
from typing import Any

from meml.plan import grid
from meml.reporting.tables import DATASET_TITLES, MISSING, Table, fmt, model_label, scale_notes

TITLES = {
    "gain": "Where does the gain come from? HSFT on one expert, HSFT with MoE, and the full method",
    "drgrpo": "MEML's switches on the Dr.GRPO loss",
    "experts": "Number of experts",
    "compute": "Compute-matched: G rollouts shared among the experts (split) against G per expert",
    "sensitivity": "Sensitivity: buffer capacity B, threshold K/G, lambda1 (IML) and lambda2 (SFT)",
    "dynamic": "The cheap fix of reward sparsity: dynamic sampling (DAPO-style) against MEML",
}
COST_TABLES = ("compute", "dynamic")  # these add the rollouts sampled and the wall time of a run


def methods_for(cfg: dict[str, Any], table: str) -> list[str]:
    """The methods shown in a table, in config order (the experts table by number of experts)."""
    chosen = [m for m in grid.used_methods(cfg) if table in grid.tables_of(cfg, m)]
    if table == "experts":
        chosen.sort(key=lambda m: len(cfg["methods"][m]["rl_experts"]))
    return chosen


def _flat(prefix: str, value: Any) -> list[str]:
    if isinstance(value, dict):
        return [item for k, v in value.items() for item in _flat(f"{prefix}{k}.", v)]
    return [f"{prefix.rstrip('.')}={value}"]


def describe(cfg: dict[str, Any], method: str) -> str:
    """A method's switches in a few words: experts 0,1,2 · grpo · IML · HSFT · buffer.capacity=4."""
    sw = cfg["methods"][method]
    parts = [f"experts {','.join(str(k) for k in sw['rl_experts'])}", sw["advantage"]]
    parts += [name for name, on in (("IML", sw["iml"]), ("HSFT", sw["hsft"])) if on]
    if sw.get("dynamic_sampling"):
        parts.append(f"dynamic sampling ({sw['dynamic_sampling']} rounds)")
    if sw.get("shuffle_advantages"):
        parts.append("advantages shuffled (null control)")
    parts += _flat("", sw.get("rl") or {})
    return " · ".join(parts)


def run_cost(results: Any, model: str, datasets: list[str], method: str) -> tuple[list[float], list[float]]:
    """Rollouts sampled and wall seconds of one RL run, per seed (averaged over the data sets)."""
    rollouts, seconds = [], []
    for seed in results.cfg["grid"]["seeds"]:
        runs = [results.steps(model, ds, method, seed) for ds in datasets]
        rollouts.append(statistics.fmean(sum(r.get("rollouts/sampled", 0.0) for r in rows) for rows in runs))
        seconds.append(statistics.fmean(sum(r["perf/step_seconds"] for r in rows) for rows in runs))
    return rollouts, seconds


def _seeds(values: list[float]) -> str:
    return " / ".join(f"{v:.1f}" for v in values) if values else MISSING


def extra_table(cfg: dict[str, Any], results: Any, name: str) -> Table:
    datasets = cfg["extras"]["datasets"]
    groups = [(DATASET_TITLES[ds], ["ours"]) for ds in datasets] + [("Avg", ["ours", "per seed"])]
    if name in COST_TABLES:
        groups.append(("one run", ["rollouts", "wall s"]))
    table = Table(name, TITLES[name], ["model", "method", "setting"], groups)
    for model in grid.extra_models(cfg):
        for method in methods_for(cfg, name):
            cells = [fmt(results.accuracy(model, ds, method)) for ds in datasets]
            seeds = results.per_seed([model], datasets, method)
            cells += [fmt(seeds), _seeds(seeds)]
            if name in COST_TABLES:
                rollouts, seconds = run_cost(results, model, datasets, method)
                cells += [f"{statistics.fmean(rollouts):.0f}", f"{statistics.fmean(seconds):.1f}"]
            table.add([model_label(cfg, model), method, describe(cfg, method)], cells)
    rl, n_seeds = cfg["rl"], len(cfg["grid"]["seeds"])
    table.notes = [
        *scale_notes(cfg),
        f"Accuracy in % ({results.metric} answer checker), "
        + (f"mean ± sd over {n_seeds} seeds" if n_seeds > 1 else "one seed")
        + "; the paper reports none of these (questions it leaves open).",
        "per seed: the average over the data sets shown, seed by seed (grid.seeds order).",
        f"setting: the method's switches and its own RL settings; the others are rl's (B = {rl['buffer']['capacity']}, "
        f"K/G = {rl['buffer']['threshold']}, lambda1 = {rl['lambda_iml']}, lambda2 = {rl['lambda_sft']}, "
        f"G = {rl['group_size']} {rl['spread']}).",
        *(
            [
                "rollouts: completions sampled over the whole RL run (dynamic sampling counts the discarded ones); "
                "wall s: the summed step times of the run on this machine."
            ]
            if name in COST_TABLES
            else []
        ),
    ]
    return table
