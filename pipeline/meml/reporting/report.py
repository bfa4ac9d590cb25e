"""The paper's tables and figures, built from result files (never from the MLflow database).

Reads, for the grid in the config:
    results/<profile>/eval/<model>/<ds>/<method>/seed<k>.json          evaluation per cell
    results/<profile>/rl/<model>/<ds>/<method>/seed<k>/metrics.jsonl   training reward per step
    results/<profile>/analysis/complementarity/<model>_<ds>.{json,png,pdf}
and writes report/<profile>/{tables/<name>.{md,tex}, figures/*.{png,pdf}, index.md}.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml

from meml.core.io import DataError, atomic_write_json, atomic_write_text
from meml.core.tracking import MLflowSettings, log_report
from meml.data.experts import prompts_of
from meml.plan import grid
from meml.plan.layout import Layout
from meml.reporting import extras, summary
from meml.reporting.analysis_tables import (
    calibration_table,
    calibration_warnings,
    complementarity_table,
    sparsity_table,
    teachers_table,
)
from meml.reporting.figures import reward_curves, sparsity_dashboard
from meml.reporting.paper_tables import ablation_table, main_table, vote_table
from meml.reporting.results import Results
from meml.reporting.tables import (
    MISSING,
    SAME_SEED_NOTE,
    Table,
    scale_notes,
    to_latex,
    to_markdown,
)


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
    data: dict[str, Any] = {}  # tables/<name>.json beside their tables: what the README's lines read
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
    if cfg["eval"].get("base"):
        from meml.reporting.base_table import base_samples, base_table

        tables += [base_table(cfg, root), base_samples(cfg, root)]
    if cfg["eval"].get("sft"):
        from meml.reporting.learning import learning_table

        table, data["learning"] = learning_table(cfg, results)
        tables.append(table)
    if cfg["extras"]["methods"]:
        tables += [extras.extra_table(cfg, results, name) for name in grid.EXTRA_TABLES]
    replication_lines: list[str] = []
    decision = summary.decided(cfg, results, reference)  # once: the index and claims.json read it
    _, entries, comparisons = decision
    level = cfg["report"]["stats"]["level"]
    claims: dict[str, Any] = {"profile": cfg["profile"], "claims": [summary.as_record(c, level) for c in comparisons]}
    if set(cfg["report"]["replicates"]) - {cfg["profile"]}:
        from meml.reporting.replication import replication

        table, replication_lines, claims["replication"] = replication(cfg, root, reference)
        tables.append(table)
    if cfg["report"]["stages"]:
        from meml.reporting.stages import stages_table

        table, stage_lines = stages_table(cfg, root, summary.spread_pairs(entries))
        tables.append(table)
        replication_lines += stage_lines
    trl_figures: list[Path] = []
    if cfg["trl"]["methods"]:
        from meml.reporting.trl_table import trl_comparison

        table, trl_figures, trl_lines, data["trl"] = trl_comparison(cfg, results, figures_dir)
        tables.append(table)
        replication_lines += ["", "Our loop against trl's GRPOTrainer on the same cells (the trl table):", *trl_lines]
    from meml.reporting.engine_gaps import gaps_figure, gaps_table, logged

    gapped = logged(cfg, results)  # cells whose steps logged the sampler or the sync gap
    if gapped:
        table, gap_lines = gaps_table(cfg, gapped)
        tables.append(table)
        replication_lines += ["", "Is the engine that samples the policy that learns (the engine_gaps table)?"]
        replication_lines += gap_lines
    written: list[Path] = []
    for table in tables:
        for ext, render in (("md", to_markdown), ("tex", to_latex)):
            path = tables_dir / f"{table.name}.{ext}"
            atomic_write_text(path, render(table))
            written.append(path)
    for name, records in data.items():
        atomic_write_json(tables_dir / f"{name}.json", {"profile": cfg["profile"], "cells": records})
        written.append(tables_dir / f"{name}.json")
    atomic_write_json(tables_dir / "claims.json", claims)  # what the README's reproduction table reads
    written.append(tables_dir / "claims.json")
    written += reward_curves(cfg, results, figures_dir) + trl_figures  # the figures in the index's order
    written += sparsity_dashboard(cfg, results, figures_dir)
    if gapped:
        written += gaps_figure(cfg, gapped, figures_dir)
    for model in grid.complementarity_models(cfg):
        for ds in cfg["grid"]["datasets"]:
            for ext in ("png", "pdf"):
                source = Layout(root).complementarity(model, ds, ext)
                target = figures_dir / f"complementarity_{model}_{ds}.{ext}"
                shutil.copyfile(source, target)
                written.append(target)
    index = out / "index.md"
    lines = summary.render(cfg, results, root, decision) + replication_lines
    warnings = calibration_warnings(cfg, root)
    if warnings:  # the gate was set to warn: say which models are outside the informative range
        lines += [
            "",
            "Calibration warnings: these MEF models are outside the informative range (in %; the calibration "
            "table; toy.pretrain.steps, sft.epochs, sft.lr and toy.sizes move accuracy, "
            "rl_by_dataset.<ds>.max_new_tokens the finished share):",
        ]
        lines += warnings
    atomic_write_text(index, index_page(cfg, tables, written, out, lines))
    written.append(index)
    from meml.reporting.run_record import note_tables_by

    note_tables_by(out)  # tables rebuilt over an older run's record: which code wrote them
    return written


def index_page(cfg: dict[str, Any], tables: list[Table], files: list[Path], out: Path, summary: list[str]) -> str:
    lines = [f"# MEML-GRPO reproduction: profile `{cfg['profile']}`", ""]
    for note in scale_notes(cfg):
        lines += [f"> {note}", ""]
    lines += [f"> {SAME_SEED_NOTE}", ""]
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
    mlflow = MLflowSettings.of(cfg)
    lines += [
        f"Every cell is an MLflow run in experiment `{mlflow.experiment}` (store `{mlflow.tracking_uri}`), "
        "tagged `cell_key` = `<profile>/<model>/<dataset>/<method>/seed<k>#<hash of its values>`.",
        "",
    ]
    if MISSING in "".join(to_markdown(t) for t in tables):
        lines.append(f"{MISSING}: no value (the paper reports none, or the cell was not evaluated).")
    return "\n".join(lines) + "\n"


def write_report(cfg: dict[str, Any], results: str | None = None, out: str | None = None) -> tuple[list[Path], Path]:
    """`meml report`: build the report of a profile from its result files, and (mlflow.enabled) log
    the tables and figures to the profile's report run."""
    from meml.core.config import PROJECT_ROOT
    from meml.plan.layout import report_dir

    layout = Layout.of(cfg, results)
    folder = Path(out) if out else report_dir(cfg)
    reference = Path(cfg["report"]["reference"])
    if not reference.is_absolute() and not reference.is_file():
        reference = PROJECT_ROOT / reference
    written = build(cfg, layout.root, folder, reference)
    if MLflowSettings.of(cfg).enabled:
        log_report(cfg, layout.report_run, written)
    return written, folder
