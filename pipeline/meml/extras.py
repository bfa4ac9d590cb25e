"""The questions the paper leaves open, as extra tables, and the report's written summary.

Extra methods (config `extras.methods`) run on extras.models x extras.datasets x grid.seeds; a
method appears in an extra table when its `tables` list names it (the paper's methods carry the
tags too, so MEML-GRPO and its baselines sit in the same rows). Every cell is the headline
expert's accuracy, mean ± sd over seeds, with the per-seed values beside it.

The summary states one sentence per claim and per open question: the measured figures and a
verdict. A verdict compares two methods seed by seed (same seed, same questions drawn): "reproduces"
only when the claimed order holds on every seed, "refutes" when the opposite order does, and
"cannot tell" otherwise or with a single seed.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from . import grid
from .io import read_json
from .report import DATASET_TITLES, TOY_NOTE, model_label, subgroup_share
from .tables import MISSING, Table, fmt

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
        *([TOY_NOTE] if cfg["world"] == "toy" else []),
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


# ------------------------------------------------------------------ the written summary


def verdict(ours: list[float], theirs: list[float], claimed: str = ">") -> str:
    """Seed-by-seed comparison of two per-seed lists (same seeds): reproduces / refutes / cannot tell."""
    if len(ours) < 2:
        return "cannot tell (one seed)"
    ahead = sum(a > b for a, b in zip(ours, theirs, strict=True))
    behind = sum(a < b for a, b in zip(ours, theirs, strict=True))
    if claimed == ">=":  # "matches or beats"
        return "reproduces" if behind == 0 else "refutes" if ahead == 0 else "cannot tell"
    return "reproduces" if ahead == len(ours) else "refutes" if behind == len(ours) else "cannot tell"


def _pair(a: str, va: list[float], b: str, vb: list[float]) -> str:
    mean_a, mean_b = statistics.fmean(va), statistics.fmean(vb)
    return f"{a} {mean_a:.1f} (seeds {_seeds(va)}) against {b} {mean_b:.1f} (seeds {_seeds(vb)})"


def _claim(text: str, a: str, va: list[float], b: str, vb: list[float], claimed: str = ">") -> str:
    """One bullet: a claim ("X beats Y") or a question ("Does X beat Y?"), the figures, the verdict."""
    sep = " " if text.endswith("?") else ": "
    return f"- {text}{sep}{_pair(a, va, b, vb)}. **{verdict(va, vb, claimed)}**."


def summary(cfg: dict[str, Any], results: Any, root: Path) -> list[str]:
    """Markdown bullets: each paper claim, then each open question the extras answer."""
    models, datasets = grid.models(cfg), cfg["grid"]["datasets"]
    used = set(grid.used_methods(cfg))

    def acc(method: str, on_extras: bool = False) -> list[float]:
        if on_extras:
            return results.per_seed(grid.extra_models(cfg), cfg["extras"]["datasets"], method)
        return results.per_seed(models, datasets, method)

    lines = [
        f"Accuracy: expert {cfg['report']['headline_expert']}'s prompt, averaged over "
        f"{', '.join(models)} and {', '.join(datasets)}; {len(cfg['grid']['seeds'])} seed(s). A verdict needs the "
        "claimed order on every seed.",
        "",
        "The paper's claims:",
    ]
    claims = [
        ("MEML-GRPO beats multi-expert GRPO (main table)", "MEML-GRPO", "MoE-SFT-GRPO"),
        ("MEML-GRPO beats single-expert GRPO", "MEML-GRPO", "Expert1-SFT-GRPO"),
        ("MEML-GRPO beats multi-expert Dr.GRPO", "MEML-GRPO", "MoE-SFT-Dr.GRPO"),
        ("MoE-SFT beats single-expert SFT under GRPO (ablation, MoE)", "MoE-SFT-GRPO", "Expert1-SFT-GRPO"),
        ("HSFT helps (ablation)", "MoE+HSFT", "MoE-SFT-GRPO"),
        ("IML helps (ablation)", "MoE+IML", "MoE-SFT-GRPO"),
        ("IML adds to HSFT (ablation, full method)", "MEML-GRPO", "MoE+HSFT"),
    ]
    for text, a, b in claims:
        if {a, b} <= used:
            lines.append(_claim(text, a, acc(a), b, acc(b)))
    if "MEML-GRPO" in used and "vote" in grid.tables_of(cfg, "MEML-GRPO"):
        vote = results.per_seed(models, datasets, "MEML-GRPO", results.vote)
        lines.append(_claim("MEML-GRPO with one expert matches or beats the experts' majority vote",
                            "one expert", acc("MEML-GRPO"), "vote", vote, ">="))  # fmt: skip
    if {"MEML-GRPO", "MoE-SFT-GRPO"} <= used:
        last = {m: _last_reward(cfg, results, m) for m in ("MEML-GRPO", "MoE-SFT-GRPO")}
        text = "MEML-GRPO's training reward ends above GRPO's (reward curves; mean of the last 3 steps, x100)"
        lines.append(_claim(text, "MEML-GRPO", last["MEML-GRPO"], "MoE-SFT-GRPO", last["MoE-SFT-GRPO"]))
    lines += _complementarity_lines(cfg, root)
    if "MoE-SFT-GRPO" in used:
        wrong = [100 * statistics.fmean(_all_wrong(results, m, ds, "MoE-SFT-GRPO")) for m in models for ds in datasets]
        share = statistics.fmean(wrong)
        lines.append(
            f"- Rewards are sparse (the paper's motivation): {share:.1f}% of (question, expert) subgroups of "
            f"MoE-SFT-GRPO are all wrong, mean over steps. **{'reproduces' if share > 50 else 'refutes'}** "
            "(more than half all wrong)."
        )
    lines += _mechanism_lines(cfg, results)
    if not cfg["extras"]["methods"]:
        lines += ["", "The open questions need the extras (`config/toy-seeds.yaml`); this run has none."]
        return lines
    ex = cfg["extras"]
    lines += [
        "",
        f"The open questions (on {', '.join(grid.extra_models(cfg))} x {', '.join(ex['datasets'])}):",
    ]
    questions = [
        ("Does HSFT alone, on one expert, beat single-expert GRPO?", "Expert1+HSFT", "Expert1-SFT-GRPO"),
        ("Does the full method beat HSFT alone (is the gain more than HSFT)?", "MEML-GRPO", "Expert1+HSFT"),
        ("Does MEML help on the Dr.GRPO loss too?", "MEML-Dr.GRPO", "MoE-SFT-Dr.GRPO"),
        ("Do five experts beat one?", "MEML-5experts", "MEML-1expert"),
        ("Do three experts beat two?", "MEML-GRPO", "MEML-2experts"),
        ("Does G per expert (3x the rollouts) beat G shared?", "MEML-per_expert", "MEML-GRPO"),
        ("Does MEML beat GRPO with dynamic sampling (the cheap fix)?", "MEML-GRPO", "MoE-SFT-GRPO+DS"),
        ("Does dynamic sampling help GRPO at all?", "MoE-SFT-GRPO+DS", "MoE-SFT-GRPO"),
    ]
    extra_used = set(ex["methods"]) | set(grid.methods(cfg))
    for text, a, b in questions:
        if {a, b} <= extra_used:
            lines.append(_claim(text, a, acc(a, True), b, acc(b, True)))
    sensitivity = [m for m in methods_for(cfg, "sensitivity") if m != "MEML-GRPO"]
    if sensitivity and "MEML-GRPO" in extra_used:
        base = acc("MEML-GRPO", True)
        moves = {m: statistics.fmean(acc(m, True)) - statistics.fmean(base) for m in sensitivity}
        worst = max(moves, key=lambda m: abs(moves[m]))
        sd = statistics.stdev(base) if len(base) > 1 else None
        if sd is None:
            word = "cannot tell (one seed)"
        else:
            word = "sensitive" if abs(moves[worst]) > 2 * sd else "within seed noise"
        lines.append(
            f"- How sensitive is MEML to B, K, lambda1, lambda2? The largest move from MEML-GRPO "
            f"({statistics.fmean(base):.1f}) is {moves[worst]:+.1f} "
            f"({worst}: {', '.join(_flat('', cfg['methods'][worst].get('rl') or {}))}), "
            f"against a seed sd of {'–' if sd is None else f'{sd:.1f}'}. **{word}** (more than twice the seed sd)."
        )
    return lines


def _mechanism_lines(cfg: dict[str, Any], results: Any) -> list[str]:
    """What the sparsity dashboard shows: how often IML and HSFT fired, and how much dynamic
    sampling had to replace, per run (means over the runs of the methods that have them)."""

    def per_run(switch: str, value: Any) -> list[float]:
        runs = [
            results.steps(c.model, c.dataset, c.method, c.seed)
            for c in grid.cells(cfg)
            if cfg["methods"][c.method].get(switch)
        ]
        return [value(rows) for rows in runs if rows]

    iml = per_run("iml", lambda rows: sum(r["iml/pairs"] for r in rows))
    hsft = per_run("hsft", lambda rows: rows[-1]["hsft/flushes"])
    parts = []
    if iml:
        parts.append(f"IML formed {statistics.fmean(iml):.1f} pairs per run (range {min(iml):.0f}-{max(iml):.0f})")
    if hsft:
        parts.append(f"HSFT flushed its buffer {statistics.fmean(hsft):.1f} times per run")
    replaced = per_run("dynamic_sampling", lambda rows: statistics.fmean(r.get("dynamic/replaced", 0.0) for r in rows))
    if replaced:
        q = cfg["rl"]["questions_per_step"]
        parts.append(
            f"dynamic sampling drew {statistics.fmean(replaced):.1f} replacement questions a step for its {q} "
            "(over up to its number of rounds)"
        )
    if not parts:
        return []
    return [f"- The mechanisms (sparsity table and figures): {'; '.join(parts)}."]


def _all_wrong(results: Any, model: str, ds: str, method: str) -> list[float]:
    rows = [r for s in results.cfg["grid"]["seeds"] for r in results.steps(model, ds, method, s)]
    return [subgroup_share("all_wrong")(r) for r in rows] or [0.0]


def _last_reward(cfg: dict[str, Any], results: Any, method: str) -> list[float]:
    out = []
    for seed in cfg["grid"]["seeds"]:
        tails = [
            statistics.fmean(r["reward/mean"] for r in results.steps(m, ds, method, seed)[-3:])
            for m in grid.models(cfg)
            for ds in cfg["grid"]["datasets"]
        ]
        out.append(100 * statistics.fmean(tails))
    return out


def _complementarity_lines(cfg: dict[str, Any], root: Path) -> list[str]:
    """The motivation figure's claim: more than 60% of one expert's errors are solved by another
    expert in the same draw (the paper, GSM8K)."""
    solved, any_right = [], []
    for model in grid.complementarity_models(cfg):
        for ds in cfg["grid"]["datasets"]:
            s = read_json(root / "analysis" / "complementarity" / f"{model}_{ds}.json")
            solved += [100 * v for v in s["solved_by_another"].values() if v is not None]
            any_right.append(100 * s["at_least_one_correct"])
    if not solved:
        return []
    share, right = statistics.fmean(solved), statistics.fmean(any_right)
    word = "cannot tell (no expert solves anything)" if right == 0 else "reproduces" if share > 60 else "refutes"
    return [
        f"- The experts are complementary (motivation figure: more than 60% of one expert's errors solved by "
        f"another): {share:.1f}% here, mean over experts and data sets; at least one expert right in "
        f"{right:.1f}% of draws. **{word}** "
        "(one sampling run, no seeds)."
    ]
