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
