"""The paper's tables and figures, built from result files (never from the MLflow database).

Reads, for the grid in the config:
    results/<profile>/eval/<model>/<ds>/<method>/seed<k>.json          evaluation per cell
    results/<profile>/rl/<model>/<ds>/<method>/seed<k>/metrics.jsonl   training reward per step
    results/<profile>/analysis/complementarity/<model>_<ds>.{json,png,pdf}
and writes report/<profile>/{tables/<name>.{md,tex}, figures/*.{png,pdf}, index.md}.
"""

from __future__ import annotations

import shutil
import statistics
from pathlib import Path
from typing import Any

import yaml

from . import extras, grid, summary
from .calibration import out_of_range
from .experts import prompts_of
from .io import DataError, atomic_write_text, read_json
from .layout import Layout
from .results import Results, ablation_flags, ablation_reference, subgroup_share
from .tables import (
    DATASET_TITLES,
    MISSING,
    TOY_NOTE,
    Table,
    fmt,
    fmt_diff,
    model_label,
    ours_paper_diff,
    to_latex,
    to_markdown,
)


def _methods_in(cfg: dict[str, Any], table: str) -> list[str]:
    return [m for m in grid.methods(cfg) if table in grid.tables_of(cfg, m)]


def _notes(cfg: dict[str, Any], results: Results, extra: list[str]) -> list[str]:
    seeds = cfg["grid"]["seeds"]
    notes = [TOY_NOTE] if cfg["world"] == "toy" else []
    spread = f"mean ± sd over {len(seeds)} seeds" if len(seeds) > 1 else "one seed"
    notes.append(
        f"Accuracy in % ({results.metric} answer checker), {spread}; paper: the published value; "
        "diff: ours minus paper."
    )
    return notes + extra


def main_table(cfg: dict[str, Any], results: Results, reference: dict[str, Any]) -> Table:
    datasets = cfg["grid"]["datasets"]
    groups = [(DATASET_TITLES[ds], ["ours", "paper", "diff"]) for ds in datasets] + [("Avg", ["ours", "paper", "diff"])]
    h = cfg["report"]["headline_expert"]
    table = Table("main", f"Main results: accuracy with expert {h}'s prompt at inference", ["model", "method"], groups)
    for model in grid.models(cfg):
        ref_model = reference.get("main", {}).get(cfg["models"][model]["paper_name"], {})
        for method in _methods_in(cfg, "main"):
            ref = ref_model.get(method, {})
            cells: list[str] = []
            for ds in datasets:
                cells += ours_paper_diff(results.accuracy(model, ds, method), ref.get(ds))
            ref_values = [ref.get(ds) for ds in datasets]
            ref_avg = statistics.fmean(ref_values) if ref and None not in ref_values else None  # type: ignore[arg-type]
            cells += ours_paper_diff(results.average(model, method), ref_avg)
            table.add([model_label(cfg, model), method], cells)
    notes = ["Paper avg: the mean of the paper's values over the data sets shown."]
    finished = results.finished()
    if finished:
        low, where = min(finished)
        mean = 100 * statistics.fmean(f for f, _ in finished)
        notes.append(
            f"Answers of expert {h} that ended within the token cap: mean {mean:.1f}%, "
            f"lowest {100 * low:.1f}% ({where}); a cut answer usually scores 0."
        )
    table.notes = _notes(cfg, results, notes)
    return table


def ablation_table(cfg: dict[str, Any], results: Results, reference: dict[str, Any]) -> Table:
    models = grid.models(cfg)
    groups = [(model_label(cfg, m), ["ours", "paper", "diff"]) for m in models]
    table = Table(
        "ablation", "Ablation: MoE / HSFT / IML, average over the data sets", ["MoE", "HSFT", "IML", "method"], groups
    )
    for method in _methods_in(cfg, "ablation"):
        flags = ablation_flags(cfg, method)
        ref_row = ablation_reference(reference, cfg, method)
        cells: list[str] = []
        for model in models:
            paper_name = cfg["models"][model]["paper_name"]
            ours, paper, diff = ours_paper_diff(results.average(model, method), ref_row.get(paper_name))
            main = _main_reference_average(cfg, reference, paper_name, method)
            if main is not None and ref_row.get(paper_name) is not None and round(main, 1) != ref_row[paper_name]:
                paper = f"{paper} (main: {main:.1f})"  # the paper's two tables disagree for this method
            cells += [ours, paper, diff]
        marks = ["x" if flags[k] else "-" for k in ("moe", "hsft", "iml")]
        table.add([*marks, method], cells)
    table.notes = _notes(
        cfg,
        results,
        [
            "Rows are matched to the paper's by their switches (MoE: SFT on several experts).",
            "Where the paper's main table gives another average for the same method (e.g. Expert1-SFT-GRPO on "
            "Qwen: 70.1 here, 69.1 there), both are shown as 'ablation (main: x)'; diff is against the ablation value.",
        ],
    )
    return table


def _main_reference_average(
    cfg: dict[str, Any], reference: dict[str, Any], paper_name: str, method: str
) -> float | None:
    """The paper's main-table average of a method, when this grid covers every data set it averages."""
    values = reference.get("main", {}).get(paper_name, {}).get(method, {})
    datasets = list(DATASET_TITLES)
    if set(cfg["grid"]["datasets"]) != set(datasets) or any(values.get(ds) is None for ds in datasets):
        return None
    return statistics.fmean(values[ds] for ds in datasets)


def vote_table(cfg: dict[str, Any], results: Results) -> Table:
    h = cfg["report"]["headline_expert"]
    groups = [(DATASET_TITLES[ds], [f"expert {h}", "vote", "diff"]) for ds in cfg["grid"]["datasets"]]
    table = Table(
        "majority_vote",
        f"One expert (expert {h}) against the majority vote of the evaluated experts",
        ["model", "method"],
        groups,
    )
    for model in grid.models(cfg):
        for method in _methods_in(cfg, "vote"):
            cells: list[str] = []
            for ds in cfg["grid"]["datasets"]:
                single, vote = results.accuracy(model, ds, method), results.vote(model, ds, method)
                cells += [fmt(single), fmt(vote), fmt_diff(single, statistics.fmean(vote) if vote else None)]
            table.add([model_label(cfg, model), method], cells)
    table.notes = _notes(
        cfg,
        results,
        [
            "The paper reports no numbers here, only that MEML-GRPO with one expert matches or beats the "
            "3-expert vote; diff: expert minus vote. Ties in the vote go to the lowest-numbered expert's answer."
        ],
    )
    return table


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
        *([TOY_NOTE] if cfg["world"] == "toy" else []),
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
        *([TOY_NOTE] if cfg["world"] == "toy" else []),
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


def calibration_table(cfg: dict[str, Any], root: Path) -> Table:
    """The gate's measurements of every MEF model RL starts from (calibration.py)."""
    ranges = cfg["calibration"]["ranges"]
    columns = ["rollout success", "finished (lowest)", "greedy accuracy", "largest answer class", "in range"]
    table = Table("calibration", "Calibration: the MEF models before RL", ["model", "data set", "SFT"],
                  [("measured", columns)])  # fmt: skip
    sampled = ""
    for model, ds, variant in grid.calibrated(cfg):
        c = read_json(Layout(root).calibration(model, ds, variant))
        sampled = f"{c['train_questions']} training questions x {c['samples']}"
        balance = c.get("answer_balance")
        table.add(
            [model_label(cfg, model), DATASET_TITLES[ds], variant],
            [
                " · ".join(f"{e} {100 * v:.0f}" for e, v in c["rollout_success"].items()),
                f"{100 * min(c['finished'].values()):.0f}",
                f"{100 * c['greedy']['accuracy']:.1f}",
                MISSING if not balance else f"{balance['largest_class']} {100 * balance['largest_share']:.0f}",
                "yes" if c["in_range"] else "no",
            ],
        )
    table.notes = [
        *([TOY_NOTE] if cfg["world"] == "toy" else []),
        f"In %. rollout success: correct samples per expert on {sampled}, at RL's temperature and length cap (range "
        f"{_pct(ranges['rollout_success'])}); finished: the lowest expert's share ending within the cap (range "
        f"{_pct(ranges['finished'])}); greedy accuracy: the headline expert on the first test questions (range "
        f"{_pct(ranges['greedy_accuracy'])}); largest answer class: its share of the test split (a constant "
        f"answer scores it). Gate: {cfg['calibration']['gate']}.",
    ]
    return table


def _pct(pair: list[float]) -> str:
    return f"{100 * pair[0]:.0f}-{100 * pair[1]:.0f}"


def calibration_warnings(cfg: dict[str, Any], root: Path) -> list[str]:
    """One line per MEF model outside the informative range: the values out of range, with theirs."""
    ranges = cfg["calibration"]["ranges"]
    names = {"rollout_success": "rollout success", "finished": "finished", "greedy_accuracy": "greedy accuracy"}
    lines = []
    for model, ds, variant in grid.calibrated(cfg):
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


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, cfg: dict[str, Any], title: str, stem: Path) -> list[Path]:
    """Title (marked toy scale in the toy world), then PNG and PDF beside each other."""
    fig.suptitle(title + (" (toy scale)" if cfg["world"] == "toy" else ""), fontsize=10)
    fig.tight_layout()
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    for path in paths:
        fig.savefig(path, dpi=130)
    _pyplot().close(fig)
    return paths


def sparsity_dashboard(cfg: dict[str, Any], results: Results, out_dir: Path) -> list[Path]:
    """Per data set: all-wrong and all-right subgroup shares per step, cumulative IML pairs and HSFT
    flushes, a column per model and a line per method."""
    plt = _pyplot()
    models = grid.models(cfg)
    rows = [
        ("all-wrong subgroups", subgroup_share("all_wrong"), False),
        ("all-right subgroups", subgroup_share("all_correct"), False),
        ("IML pairs (cumulative)", "iml/pairs", True),
        ("HSFT flushes", "hsft/flushes", False),
    ]
    written = []
    for ds in cfg["grid"]["datasets"]:
        fig, axes = plt.subplots(len(rows), len(models), figsize=(4.2 * len(models), 2.2 * len(rows)), squeeze=False)
        for col, model in enumerate(models):
            for row, (label, metric, cumulative) in enumerate(rows):
                ax = axes[row][col]
                for method in grid.methods(cfg):
                    values = results.curve(model, ds, method, metric)
                    if cumulative:
                        values = [sum(values[: i + 1]) for i in range(len(values))]
                    ax.plot(range(1, len(values) + 1), values, marker="o", markersize=2, label=method)
                ax.set_ylabel(label, fontsize=7)
                ax.grid(alpha=0.3)
            axes[0][col].set_title(model_label(cfg, model), fontsize=9)
            axes[-1][col].set_xlabel("RL step")
        axes[0][-1].legend(fontsize=6)
        written += _save(
            fig, cfg, f"{DATASET_TITLES[ds]}: reward sparsity and MEML's mechanisms", out_dir / f"sparsity_{ds}"
        )
    return written


def reward_curves(cfg: dict[str, Any], results: Results, out_dir: Path) -> list[Path]:
    """One figure per data set: training reward per step, a panel per model, a line per method."""
    plt = _pyplot()
    models = grid.models(cfg)
    methods = _methods_in(cfg, "curves")
    written = []
    for ds in cfg["grid"]["datasets"]:
        fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.2), squeeze=False, sharey=True)
        for ax, model in zip(axes[0], models, strict=True):
            for method in methods:
                runs = results.curves(model, ds, method)
                curve = results.curve(model, ds, method)
                steps = range(1, len(curve) + 1)
                (line,) = ax.plot(steps, curve, marker="o", markersize=3, label=method)
                if len(runs) > 1:  # the band: lowest to highest seed at each step
                    low = [min(step) for step in zip(*runs, strict=True)]
                    high = [max(step) for step in zip(*runs, strict=True)]
                    ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.15, linewidth=0)
            ax.set_title(model_label(cfg, model), fontsize=9)
            ax.set_xlabel("RL step")
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel(
            "mean training reward" + (" (band: seeds' range)" if len(cfg["grid"]["seeds"]) > 1 else "")
        )
        axes[0][-1].legend(fontsize=7)
        written += _save(fig, cfg, f"{DATASET_TITLES[ds]}: training reward per step", out_dir / f"reward_curves_{ds}")
    return written


def build(
    cfg: dict[str, Any], results_root: str | Path, out_root: str | Path, reference_path: str | Path
) -> list[Path]:
    """Every table and figure, then an index page linking them. Returns the files written."""
    root, out = Path(results_root), Path(out_root)
    ref_file = Path(reference_path)
    if not ref_file.is_file():
        raise DataError("paper reference file not found", ref_file, None, "report.reference")
    reference = yaml.safe_load(ref_file.read_text()) or {}
    results = Results(cfg, root)
    tables_dir, figures_dir = out / "tables", out / "figures"
    tables_dir.mkdir(parents=True, exist_ok=True)
    figures_dir.mkdir(parents=True, exist_ok=True)
    tables = [
        main_table(cfg, results, reference),
        ablation_table(cfg, results, reference),
        vote_table(cfg, results),
        complementarity_table(cfg, root, reference),
        sparsity_table(cfg, results),
        calibration_table(cfg, root),
    ]
    if cfg["world"] == "real":
        tables.append(teachers_table(cfg, root, len(prompts_of(cfg))))
    if cfg["extras"]["methods"]:
        tables += [extras.extra_table(cfg, results, name) for name in grid.EXTRA_TABLES]
    written: list[Path] = []
    for table in tables:
        for ext, render in (("md", to_markdown), ("tex", to_latex)):
            path = tables_dir / f"{table.name}.{ext}"
            atomic_write_text(path, render(table))
            written.append(path)
    written += reward_curves(cfg, results, figures_dir)
    written += sparsity_dashboard(cfg, results, figures_dir)
    for model in grid.complementarity_models(cfg):
        for ds in cfg["grid"]["datasets"]:
            for ext in ("png", "pdf"):
                source = Layout(root).complementarity(model, ds, ext)
                target = figures_dir / f"complementarity_{model}_{ds}.{ext}"
                shutil.copyfile(source, target)
                written.append(target)
    index = out / "index.md"
    lines = summary.render(cfg, results, root, reference)
    warnings = calibration_warnings(cfg, root)
    if warnings:  # the gate was set to warn: say which models are outside the informative range
        lines += [
            "",
            "Calibration warnings: these MEF models are outside the informative range (in %; the calibration "
            "table; sft.epochs, sft.lr and toy.sizes move accuracy, rl_by_dataset.<ds>.max_new_tokens the finished "
            "share):",
        ]
        lines += warnings
    atomic_write_text(index, index_page(cfg, tables, written, out, lines))
    written.append(index)
    return written


def index_page(cfg: dict[str, Any], tables: list[Table], files: list[Path], out: Path, summary: list[str]) -> str:
    lines = [f"# MEML-GRPO reproduction: profile `{cfg['profile']}`", ""]
    if cfg["world"] == "toy":
        lines += [f"> {TOY_NOTE}", ""]
    lines += ["## What the numbers say", "", *summary, ""]
    lines += ["## Tables", ""]
    for t in tables:
        lines.append(f"- {t.title}: [Markdown](tables/{t.name}.md), [LaTeX](tables/{t.name}.tex)")
    lines += ["", "## Figures", ""]
    for path in files:
        if path.suffix == ".png":
            rel = path.relative_to(out).as_posix()
            lines += [f"![{path.stem}]({rel}) ([PDF]({rel[:-4]}.pdf))", ""]
    lines += ["", "## Tables in full", ""]
    for t in tables:
        lines += [to_markdown(t), ""]
    experiment = cfg["mlflow"]["experiment"] or cfg["profile"]  # as the CLI names it
    lines += [
        f"Every cell is an MLflow run in experiment `{experiment}` (store `{cfg['mlflow']['tracking_uri']}`), "
        "tagged `cell_key` = `<profile>/<model>/<dataset>/<method>/seed<k>#<hash of its values>`.",
        "",
    ]
    if MISSING in "".join(to_markdown(t) for t in tables):
        lines.append(f"{MISSING}: no value (the paper reports none, or the cell was not evaluated).")
    return "\n".join(lines) + "\n"
