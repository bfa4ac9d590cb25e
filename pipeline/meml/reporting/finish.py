"""The few lines a run ends with: where the report is, how to open it and MLflow, and the
summary's first verdict, so that a user never has to look for the result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from meml.core.tracking import MLflowSettings, grouped_view_url
from meml.plan.layout import Layout, report_dir


def headline(index: Path) -> str | None:
    """The first claim line of the report's written summary ("What the numbers say")."""
    if not index.is_file():
        return None
    lines = index.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("## What the numbers say")), None)
    if start is None:
        return None
    return next((line[2:] for line in lines[start:] if line.startswith("- ")), None)


def stale_report(cfg: dict[str, Any], index: Path) -> bool:
    """Whether an evaluation is newer than the report (a run that named a cell's output, not the
    report): the report no longer shows every result."""
    evaluations = Layout.of(cfg).root / "eval"
    if not index.is_file() or not evaluations.is_dir():
        return False
    built = index.stat().st_mtime
    return any(p.stat().st_mtime > built for p in evaluations.rglob("*.json"))


def message(cfg: dict[str, Any]) -> str:
    profile = cfg["profile"]
    index = report_dir(cfg) / "index.md"
    if stale_report(cfg, index):
        return "\n".join([
            "",
            f"Done. The report {index} predates the newest evaluations: rebuild it with",
            f"  .venv/bin/snakemake --cores N -- {index}"
            + ("" if profile == "toy" else "   (with this run's --configfile)"),
        ])  # fmt: skip
    lines = [
        "",
        f"Done. Report: {index} (tables in report/{profile}/tables, figures in report/{profile}/figures)",
        "  HTML report:  .venv/bin/snakemake --report report/report.html"
        + ("" if profile == "toy" else " --configfile <your config>"),
    ]
    mlflow = MLflowSettings.of(cfg)
    if mlflow.enabled:
        uri = mlflow.tracking_uri
        server = uri.startswith(("http://", "https://"))  # a tracking server: its UI is already up
        experiment = f"(experiment '{mlflow.experiment}')"
        if server:
            lines.append(f"  MLflow:       the tracking server {uri} {experiment}")
        else:
            lines.append(f"  MLflow:       .venv/bin/mlflow ui --backend-store-uri {uri} {experiment}")
        marker = Layout.of(cfg).mlflow_marker  # written by the mlflow_store rule
        made = json.loads(marker.read_text()) if marker.is_file() else {}
        # the marker's experiment where it is this config's store (the mlflow keys are run keys: a
        # store named after the marker was written holds another id)
        if made.get("experiment_id") and (made.get("tracking_uri"), made.get("experiment")) == (uri, mlflow.experiment):
            experiment_id = made["experiment_id"]
            url = grouped_view_url(experiment_id, uri.rstrip("/")) if server else grouped_view_url(experiment_id)
            lines.append(f"                {'' if server else 'then '}open {url} (the runs grouped by method)")
    first = headline(index)
    if first:
        lines.append(f"  Summary:      {first}")
        lines.append("  Same seed:    the same numbers on this machine; another CPU may round differently and")
        lines.append("                give others (docs/reliability.md, 'Same seed, same numbers: where that holds')")
    return "\n".join(lines)
