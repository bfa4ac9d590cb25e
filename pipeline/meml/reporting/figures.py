"""The report's figures: training reward per step (a band over seeds) and the sparsity dashboard."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from meml.plan import grid
from meml.reporting.paper_tables import methods_in
from meml.reporting.results import Results, subgroup_share
from meml.reporting.tables import (
    DATASET_TITLES,
    model_label,
)


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
    methods = methods_in(cfg, "curves")
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
