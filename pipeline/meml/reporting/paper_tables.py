"""The paper's own tables from result files: main results (its Table 1), the ablation grid (Table 2)
and single expert against the majority vote, each beside the paper's numbers."""

from __future__ import annotations

import statistics
from typing import Any

from meml.plan import grid
from meml.reporting.results import Results, ablation_flags, ablation_reference
from meml.reporting.tables import (
    DATASET_TITLES,
    Table,
    fmt,
    fmt_diff,
    model_label,
    ours_paper_diff,
    scale_notes,
)


def methods_in(cfg: dict[str, Any], table: str) -> list[str]:
    return [m for m in grid.methods(cfg) if table in grid.tables_of(cfg, m)]


def _notes(cfg: dict[str, Any], results: Results, extra: list[str]) -> list[str]:
    seeds = cfg["grid"]["seeds"]
    notes = scale_notes(cfg)
    spread = f"mean ± sd over {len(seeds)} seeds" if len(seeds) > 1 else "one seed"
    notes.append(
        f"Accuracy in % ({results.metric} answer checker), {spread}; paper: the published value; "
        "diff: ours minus paper."
    )
    return [*notes, *extra, results.cut_note()]


def main_table(cfg: dict[str, Any], results: Results, reference: dict[str, Any]) -> Table:
    datasets = cfg["grid"]["datasets"]
    groups = [(DATASET_TITLES[ds], ["ours", "paper", "diff"]) for ds in datasets] + [("Avg", ["ours", "paper", "diff"])]
    h = cfg["report"]["headline_expert"]
    table = Table("main", f"Main results: accuracy with expert {h}'s prompt at inference", ["model", "method"], groups)
    for model in grid.models(cfg):
        ref_model = reference.get("main", {}).get(cfg["models"][model]["paper_name"], {})
        for method in methods_in(cfg, "main"):
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
            f"lowest {100 * low:.1f}% ({where})."
        )
    table.notes = _notes(cfg, results, notes)
    return table


def ablation_table(cfg: dict[str, Any], results: Results, reference: dict[str, Any]) -> Table:
    models = grid.models(cfg)
    groups = [(model_label(cfg, m), ["ours", "paper", "diff"]) for m in models]
    table = Table(
        "ablation", "Ablation: MoE / HSFT / IML, average over the data sets", ["MoE", "HSFT", "IML", "method"], groups
    )
    for method in methods_in(cfg, "ablation"):
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
        for method in methods_in(cfg, "vote"):
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
