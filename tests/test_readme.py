"""The README is the front door: short, and its reproduction table is what the committed reports
render (meml.reporting.readme_table), never typed by hand."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import PROJECT

from meml.reporting import readme_table


def test_the_readme_table_is_what_the_committed_study_reports_render() -> None:
    assert readme_table.copy_in("README.md") == readme_table.render(), (
        "README.md's reproduction table differs from the committed reports: "
        "run python -m meml.reporting.readme_table --write"
    )
    assert readme_table.copy_in("README.md#real") == readme_table.render_real(), (
        "README.md's line on a real model differs from report/example/real-learn/: "
        "run python -m meml.reporting.readme_table --write"
    )
    for name in ("config/README.md", "report/example/README.md"):
        assert readme_table.copy_in(name) == readme_table.run_times(), (
            f"{name}'s run times differ from the committed run.json files: "
            "run python -m meml.reporting.readme_table --write"
        )


def test_the_run_times_come_from_each_run_record(tmp_path: Path) -> None:
    record = {"commit": "0123456789abcdef", "dirty": True, "cores": 2, "wall_seconds": 297.5,
              "job_seconds": 572.8, "jobs_by_rule": {"rl": 42, "sft": 12}}  # fmt: skip
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "run.json").write_text(json.dumps(record))
    (tmp_path / "old").mkdir()  # a report made before run records: not listed
    lines = readme_table.run_times(tmp_path).splitlines()
    assert lines[2:] == ["| `report/example/toy/` | 5.0 min | 2 | 573 | 54 | 0123456 (uncommitted changes) |"]
    # a run of two commands by two commits names both, in order; one commit throughout, once
    parts = [{"commit": "a" * 40, "dirty": False}, {"commit": "b" * 40, "dirty": True}]
    (tmp_path / "toy" / "run.json").write_text(json.dumps({**record, "invocations": parts, "tables_by": "c" * 40}))
    assert (
        readme_table.run_times(tmp_path)
        .splitlines()[2]
        .endswith("| aaaaaaa + bbbbbbb (uncommitted changes), tables by ccccccc |")
    )
    (tmp_path / "toy" / "run.json").write_text(json.dumps({**record, "invocations": parts[:1] * 2}))
    assert readme_table.run_times(tmp_path).splitlines()[2].endswith("| 0123456 (uncommitted changes) |")


def test_the_real_models_line_reads_its_report(tmp_path: Path) -> None:
    """Two cells under expert 1's prompt: one whose interval excludes 0 above chance, one whose
    interval reaches 0; trl's record; the run's two commands from its run.json."""
    cell = {"dataset": "strategyqa", "expert": "e1", "questions": 300, "rl_steps": 40, "level": 0.95, "chance": 50.3}
    cells = [
        {**cell, "method": "A", "accuracy": 60.0, "sft_accuracy": 52.0, "difference": 8.0, "low": 2.5, "high": 13.5},
        {**cell, "method": "B", "accuracy": 51.0, "sft_accuracy": 47.0, "difference": 4.0, "low": -2.0, "high": 10.0},
        {**cell, "method": "B", "expert": "e0", "accuracy": 0, "sft_accuracy": 0, "difference": 0, "low": 0, "high": 0},
    ]
    trl = {"method": "A", "faster": "ours", "ratio": 1.5, "step_seconds": {"ours": 30.0, "trl": 45.0},
           "difference": 1.0, "low": -3.0, "high": 5.0, "engines": {"ours": "vllm", "trl": "transformers"}}  # fmt: skip
    run = {"cores": 2, "invocations": [{"wall_seconds": 3600.0}, {"wall_seconds": 1500.0}]}
    tables = tmp_path / "real-learn" / "tables"
    tables.mkdir(parents=True)
    (tables / "learning.json").write_text(json.dumps({"cells": cells}))
    (tables / "trl.json").write_text(json.dumps({"cells": [trl]}))
    (tmp_path / "real-learn" / "run.json").write_text(json.dumps(run))
    assert readme_table.render_real(tmp_path) == (
        "A real model: SmolLM2-135M-Instruct on 300 real StrategyQA test questions (`config/real-learn.yaml`, "
        "`report/example/real-learn/`), held-out accuracy under expert 1's prompt after 40 RL steps against the SFT "
        "model it started from, paired by question [95% CI]: A 60.0% against 52.0%, +8.0 [+2.5, +13.5] (above its "
        "SFT start); B 51.0% against 47.0%, +4.0 [-2.0, +10.0] (no clear change). A constant answer scores 50.3%. "
        "On A's cell beside trl's GRPOTrainer (same start, questions, reward and settings; rollouts by vLLM in ours, "
        "transformers' generate in trl's), our loop ran 1.50x "
        "faster a step (30 s against 45 s), held-out ours minus trl's +1.0 [-3.0, +5.0]. Time on 2 cores, one figure "
        "a command: 60 + 25 min (its run.json)."
    )
    below = [{**cells[1], "accuracy": 49.0, "sft_accuracy": 45.0}]  # both under the 50.3% a constant scores
    (tables / "learning.json").write_text(json.dumps({"cells": below}))
    assert "(both at or below chance)" in readme_table.render_real(tmp_path)
    # a run that generated the toy world trained on its synthetic problems, and says so
    (tmp_path / "real-learn" / "run.json").write_text(json.dumps({**run, "jobs_by_rule": {"toy_world": 1}}))
    assert readme_table.render_real(tmp_path).startswith(
        "A real model: SmolLM2-135M-Instruct on 300 held-out synthetic StrategyQA-format problems (the toy world's) "
    )


def test_the_readme_stays_a_front_door() -> None:
    text = (PROJECT / "README.md").read_text()
    assert len(text.splitlines()) <= 130
    assert "../shared" not in text  # nothing outside the repository


def test_the_table_renders_claims_and_times_from_the_files(tmp_path: Path) -> None:
    claim = {"text": "MEML-GRPO > MoE-SFT-GRPO", "paper": "paper: 69.0 vs 63.4, +5.6", "difference": 5.04,
             "low": 3.0, "high": 7.1, "level": 0.95, "verdict": "supported", "tau": 0.0, "i2": 0.0}  # fmt: skip
    tables = tmp_path / readme_table.STUDY / "tables"
    tables.mkdir(parents=True)
    second = {**claim, "text": "IML helps", "paper": "", "verdict": "inconclusive (x)"}
    replication = {"runs": ["toy-study", "toy-study-replica"], "covered": 17, "pairs": 18, "pooled": [claim, second]}
    (tables / "claims.json").write_text(json.dumps({"claims": [], "replication": replication}))
    for profile, seconds in (("toy-study", 3720.0), ("toy-study-replica", 3900.0)):
        (tmp_path / profile).mkdir(exist_ok=True)
        (tmp_path / profile / "run.json").write_text(json.dumps({"wall_seconds": seconds}))
    lines = readme_table.render(tmp_path).splitlines()
    assert lines[2] == (
        "| MEML-GRPO > MoE-SFT-GRPO | +5.6 | +5.0 [+3.0, +7.1] | supported | `config/toy-study.yaml` | `make study` "
        "| 62 + 65 min (2 runs) |"
    )
    assert lines[3] == "| IML helps | – | +5.0 [+3.0, +7.1] | inconclusive | ″ | ″ | ″ |"
    assert "in 17 of 18 (claim, run) pairs" in lines[-1]
