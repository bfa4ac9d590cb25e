"""The tables that explain the paper's: expert complementarity, reward sparsity per method, the
calibration gate's measurements, and (real world) the teachers' acceptance."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from meml.core.io import read_json
from meml.evaluation.calibration import out_of_range, ranges_for
from meml.plan import grid
from meml.plan.layout import Layout
from meml.reporting.results import Results, subgroup_share
from meml.reporting.tables import (
    DATASET_TITLES,
    MISSING,
    Table,
    fmt,
    model_label,
    ours_paper_diff,
    scale_notes,
)

COMPLEMENTARITY_ROWS = [
    ("error rate, expert 0", lambda s: s["error_rate"].get("e0"), "error_rate_e0"),
    ("error rate, expert 1", lambda s: s["error_rate"].get("e1"), "error_rate_e1"),
    ("error rate, expert 2", lambda s: s["error_rate"].get("e2"), "error_rate_e2"),
    ("all experts wrong, share of wrong draws", lambda s: s["all_wrong_among_wrong"], "all_wrong_among_wrong"),
    (
        "one expert's errors solved by another (mean)",
        lambda s: (
            statistics.fmean(v for v in s["solved_by_another"].values() if v is not None)
            if any(v is not None for v in s["solved_by_another"].values())
            else None
        ),
        "solved_by_another",
    ),
    ("at least one expert right", lambda s: s["at_least_one_correct"], "at_least_one_correct"),
]


def complementarity_table(cfg: dict[str, Any], root: Path, reference: dict[str, Any]) -> Table:
    datasets = cfg["grid"]["datasets"]
    groups = [(DATASET_TITLES[ds], ["ours", "paper", "diff"]) for ds in datasets]
    settings = cfg["analysis"]["complementarity"]
    table = Table(
        "complementarity",
        f"Expert complementarity after MEF: {settings['samples']} samples per expert and question",
        ["model", "statistic (%)"],
        groups,
    )
    ref = reference.get("complementarity", {})
    for model in grid.complementarity_models(cfg):
        stats = {ds: read_json(Layout(root).complementarity(model, ds)) for ds in datasets}
        for label, get, key in COMPLEMENTARITY_ROWS:
            cells: list[str] = []
            for ds in datasets:
                value = get(stats[ds])
                cells += ours_paper_diff([] if value is None else [100 * value], ref.get(ds, {}).get(key))
            table.add([model_label(cfg, model), label], cells)
    table.notes = [
        *scale_notes(cfg),
        f"The MEF (SFT) model sampled at temperature {cfg['rl']['temperature']}; the paper's values are "
        "approximate, read from its motivation figure and text.",
    ]
    return table


def teachers_table(cfg: dict[str, Any], root: Path, n_experts: int) -> Table:
    """Real world: how the teachers' trajectories were made (rejection sampling's yield)."""
    groups = [(f"expert {k}", ["accepted %", "questions kept", "words"]) for k in range(1, n_experts)]
    table = Table("teachers", "Teacher trajectories: acceptance by the answer checker", ["data set"], groups)
    for ds in cfg["grid"]["datasets"]:
        cells: list[str] = []
        for k in range(1, n_experts):
            s = read_json(Layout(root).experts("real", ds) / f"e{k}.stats.json")
            rate = s.get("acceptance_rate")
            cells += [
                MISSING if rate is None else f"{100 * rate:.1f}",
                f"{s['questions_with_trajectory']} / {s['questions']}",
                str(s.get("length", {}).get("words_mean", MISSING)),
            ]
        table.add([DATASET_TITLES[ds]], cells)
    table.notes = ["accepted %: accepted / attempted answers (each question tried up to max_attempts times)."]
    return table


def sparsity_table(cfg: dict[str, Any], results: Results) -> Table:
    """How often GRPO had no signal, and how often MEML's two mechanisms fired, per cell."""
    groups = [
        (DATASET_TITLES[ds], ["all wrong", "all right", "IML pairs", "HSFT flushes", "cut"])
        for ds in cfg["grid"]["datasets"]
    ]
    table = Table(
        "sparsity", "Reward sparsity during RL, and how often IML and HSFT fired", ["model", "method"], groups
    )
    extra = [m for m in cfg["extras"]["methods"] if m not in grid.methods(cfg)]
    rows_of = [(model, method) for model in grid.models(cfg) for method in grid.methods(cfg)]
    rows_of += [(model, method) for model in grid.extra_models(cfg) for method in extra]  # on extras.datasets
    for model, method in rows_of:
        cells: list[str] = []
        for ds in cfg["grid"]["datasets"]:
            per_seed = [results.steps(model, ds, method, s) for s in cfg["grid"]["seeds"]]
            cells += [
                fmt(
                    [100 * statistics.fmean(subgroup_share("all_wrong")(r) for r in rows) for rows in per_seed if rows]
                ),
                fmt(
                    [
                        100 * statistics.fmean(subgroup_share("all_correct")(r) for r in rows)
                        for rows in per_seed
                        if rows
                    ]
                ),
                fmt([sum(r["iml/pairs"] for r in rows) for rows in per_seed if rows]),
                fmt([rows[-1]["hsft/flushes"] for rows in per_seed if rows]),
                _truncated(cfg, method, [r for rows in per_seed for r in rows]),
            ]
        table.add([model_label(cfg, model), method], cells)
    table.notes = [
        *scale_notes(cfg),
        "all wrong / all right: % of (question, expert) subgroups whose rollouts all fail / all succeed, mean over "
        "steps and the method's experts (GRPO gets no gradient from either); IML pairs: total over training; "
        "HSFT flushes: SFT updates from the hard-example buffer; cut: % of each expert's rollouts cut at "
        "max_new_tokens (they score 0), mean over steps and seeds. The paper reports none of these. The extra "
        "methods (if any) ran on extras.datasets only.",
    ]
    return table


def _truncated(cfg: dict[str, Any], method: str, rows: list[dict[str, float]]) -> str:
    """Each expert's share of rollouts cut at the length cap, e.g. "e0 0 · e1 4 · e2 1"."""
    parts = []
    for k in cfg["methods"][method]["rl_experts"]:
        values = [r[f"completion/truncated/expert{k}"] for r in rows if f"completion/truncated/expert{k}" in r]
        if values:
            parts.append(f"e{k} {100 * statistics.fmean(values):.0f}")
    return " · ".join(parts) or MISSING


MIXED_NOTE = (
    "mixed groups: the questions whose samples disagree, some right and some wrong (only such a group gives GRPO "
    "a non-zero advantage; an RL subgroup larger than these samples is mixed more often); "
)


def _per_expert(shares: dict[str, float]) -> str:
    return " · ".join(f"{e} {100 * v:.0f}" for e, v in shares.items()) or MISSING


def calibration_table(cfg: dict[str, Any], root: Path) -> Table:
    """The gate's measurements of every MEF model RL starts from (calibration.py)."""
    found = {(model, ds, variant): read_json(Layout(root).calibration(model, ds, variant))
             for model, ds, variant in grid.calibrated(cfg)}  # fmt: skip
    mixed = any("mixed_groups" in c for c in found.values())  # files written before it was measured lack it
    columns = ["rollout success", *(["mixed groups"] if mixed else []), "finished (lowest)", "mean tokens",
               "greedy accuracy", "largest answer class", "in range"]  # fmt: skip
    table = Table("calibration", "Calibration: the MEF models before RL", ["model", "data set", "SFT"],
                  [("measured", columns)])  # fmt: skip
    sampled = ""
    datasets = list(dict.fromkeys(ds for _, ds, _ in grid.calibrated(cfg)))
    for (model, ds, variant), c in found.items():
        sampled = f"{c['train_questions']} training questions x {c['samples']}"
        balance = c.get("answer_balance")
        table.add(
            [model_label(cfg, model), DATASET_TITLES[ds], variant],
            [
                " · ".join(f"{e} {100 * v:.0f}" for e, v in c["rollout_success"].items()),
                *([_per_expert(c.get("mixed_groups", {}))] if mixed else []),
                f"{100 * min(c['finished'].values()):.0f}",
                " · ".join(f"{e} {v:.0f}" for e, v in c.get("mean_tokens", {}).items()) or MISSING,
                f"{100 * c['greedy']['accuracy']:.1f}",
                MISSING if not balance else f"{balance['largest_class']} {100 * balance['largest_share']:.0f}",
                "yes" if c["in_range"] else "no",
            ],
        )
    table.notes = [
        *scale_notes(cfg),
        f"In %. rollout success: correct samples per expert on {sampled}, at RL's temperature and length cap; "
        + (MIXED_NOTE if mixed else "")
        + "finished: the lowest expert's share ending within the cap; mean tokens: each "
        "expert's mean sample length "
        "(a MEF model that ignores its expert prompts writes one style, so one length, for all); greedy accuracy: "
        "the headline expert on the first test questions; largest answer class: its share of the test split (a "
        f"constant answer scores it). Gate: {cfg['calibration']['gate']}. Ranges (calibration.ranges, with "
        "calibration.ranges_by_dataset laid over them): " + "; ".join(_ranges_of(cfg, ds) for ds in datasets) + ".",
    ]
    return table


def _ranges_of(cfg: dict[str, Any], dataset: str) -> str:
    """A data set's calibration ranges in words, for the table's notes."""
    r = ranges_for(cfg["calibration"], dataset)[0]
    return (
        f"{DATASET_TITLES[dataset]} rollout success {_pct(r['rollout_success'])}, finished {_pct(r['finished'])}, "
        f"greedy {_pct(r['greedy_accuracy'])}"
    )


def _pct(pair: list[float]) -> str:
    return f"{100 * pair[0]:.0f}-{100 * pair[1]:.0f}"


def calibration_warnings(cfg: dict[str, Any], root: Path) -> list[str]:
    """One line per MEF model outside the informative range: the values out of range, with theirs."""
    names = {"rollout_success": "rollout success", "finished": "finished", "greedy_accuracy": "greedy accuracy"}
    lines = []
    for model, ds, variant in grid.calibrated(cfg):
        ranges = ranges_for(cfg["calibration"], ds)[0]
        found = out_of_range(read_json(Layout(root).calibration(model, ds, variant)), ranges)
        parts = [
            f"{names[key]} {' · '.join(f'{e} {100 * v:.0f}' for k, e, v in found if k == key)} "
            f"(range {_pct(ranges[key])})"
            for key in names
            if any(k == key for k, _, _ in found)
        ]
        if parts:
            lines.append(f"- {model}/{ds}/{variant}: {'; '.join(parts)}")
    return lines
