"""The README is the front door: short, and its reproduction table is what the committed reports
render (meml.reporting.readme_table), never typed by hand."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import PROJECT

from meml.reporting import readme_table


def test_the_readme_table_is_what_the_committed_study_reports_render() -> None:
    assert readme_table.readme_copy() == readme_table.render(), (
        "README.md's reproduction table differs from the committed reports: "
        "run python -m meml.reporting.readme_table --write"
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
