"""The paper's path end to end on a CPU: config/real-smoke.yaml (world: real) on the real data sets
in ../shared/datasets, tiny models shaped like the paper's, every CPU teacher backend, the report."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PROJECT

SHARED = PROJECT.parent / "shared" / "datasets"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/datasets (the real data sets) is not beside the project"),
]
CONFIG = PROJECT / "config" / "real-smoke.yaml"
RESULTS = "results/real-smoke"


def _snakemake(tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(PROJECT / "Snakefile"), "--directory", str(tmp),
           "--cores", "2", "--configfile", str(CONFIG), str(tmp / "paths.yaml"), *extra]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=tmp)


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("real_smoke")
    (tmp / "paths.yaml").write_text(
        "data:\n" + "".join(f"  {ds}: {{local: {SHARED / ds}}}\n" for ds in ("gsm8k", "strategyqa", "mathqa"))
    )
    done = _snakemake(tmp)
    assert done.returncode == 0, done.stderr[-5000:]
    return tmp


def test_every_table_of_the_real_world(real_run: Path) -> None:
    tables = real_run / "report/real-smoke/tables"
    for name in ("main", "ablation", "majority_vote", "complementarity", "teachers", "sparsity"):
        md = (tables / f"{name}.md").read_text()
        rows = [line for line in md.splitlines() if line.startswith("|")]
        assert len(rows) >= 3 and len({row.count("|") for row in rows}) == 1, name
        assert (tables / f"{name}.tex").is_file()
    main = (tables / "main.md").read_text()
    assert "Llama-3.2-1B-Instruct" in main and "79.6" in main  # the paper's numbers beside ours
    assert "Toy scale" not in main


def test_the_real_tasks_read_the_real_prepared_files(real_run: Path) -> None:
    from meml.data.loaders import load_local

    for ds in ("gsm8k", "strategyqa", "mathqa"):
        real = [r for r in load_local(ds, SHARED / ds) if r.split == "test"][:8]
        report = json.loads((real_run / f"{RESULTS}/eval/llama/{ds}/MEML-GRPO/seed0.json").read_text())["model"]
        assert [(q["id"], q["gold"]) for q in report["samples"]] == [(r.id, r.answer) for r in real]
        assert {"e0", "e1", "e2"} <= set(report["experts"]) and "majority_vote" in report


def test_the_teachers_table_counts_what_the_server_answered(real_run: Path) -> None:
    teachers = (real_run / "report/real-smoke/tables/teachers.md").read_text()
    for ds, title in (("gsm8k", "GSM8K"), ("strategyqa", "StrategyQA"), ("mathqa", "MathQA")):
        server = json.loads((real_run / f"{RESULTS}/real/experts/{ds}/e1.standin.json").read_text())
        stats = json.loads((real_run / f"{RESULTS}/real/experts/{ds}/e1.stats.json").read_text())
        assert stats["attempted"] == server["requests"] and stats["accepted"] == server["accepted_expected"]
        row = next(line for line in teachers.splitlines() if line.startswith(f"| {title} "))
        assert f"{100 * stats['accepted'] / stats['attempted']:.1f}" in row
        kept = [json.loads(x) for x in (real_run / f"{RESULTS}/real/experts/{ds}/e1.jsonl").read_text().splitlines()]
        assert kept and all(x["completion"].startswith("<think>\n") for x in kept)  # reasoning_content kept
        byo = json.loads((real_run / f"{RESULTS}/real/experts/{ds}/e2.stats.json").read_text())
        assert byo["teacher"]["backend"] == "jsonl" and byo["accepted"] < byo["attempted"]  # wrong ones dropped


def test_one_mlflow_run_per_cell_and_a_second_run_does_nothing(real_run: Path) -> None:
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{real_run / 'results/mlflow.db'}")
    keys = [r.data.tags["cell_key"] for r in mlflow.search_runs(experiment_names=["real-smoke"], output_format="list")]
    cells = [k for k in keys if re.match(r"real-smoke/(qwen2|llama)/", k)]
    assert len(keys) == len(set(keys)) and len(cells) == 2 * 3 * 7
    again = _snakemake(real_run)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
