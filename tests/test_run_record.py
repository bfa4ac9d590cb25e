"""report/<profile>/run.json: the run's facts, summed over the invocations that made it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meml.core.config import load_config
from meml.reporting import run_record


def _jobs(metadata: Path, jobs: list[tuple[str, str, float, float]]) -> None:
    metadata.mkdir(parents=True, exist_ok=True)
    for i, (job, rule, begin, end) in enumerate(jobs):
        record = {"job_hash": job, "rule": rule, "starttime": begin, "endtime": end}
        (metadata / f"{job}-{i}").write_text(json.dumps(record))


def test_a_run_in_two_parts_is_one_record_whose_sums_cover_both(tmp_path: Path) -> None:
    cfg = load_config(None, {"profile": "t", "grid.seeds": [0, 1]})
    metadata, path = tmp_path / ".snakemake/metadata", tmp_path / "report/t/run.json"
    _jobs(metadata, [("old", "rl", 10.0, 50.0), ("a", "tiny_model", 100.0, 160.0), ("b", "rl", 160.0, 170.0)])
    first = run_record.update(path, cfg, 100.0, 180.0, run_record.jobs_since(metadata, 100.0))
    assert first["invocations"][0]["jobs"] == 2  # the older run's job is not this run's
    assert first["job_seconds_by_rule"] == {"rl": 10.0, "tiny_model": 60.0} and first["wall_seconds"] == 80.0
    _jobs(metadata, [("c", "rl", 300.0, 320.0), ("d", "evaluate", 320.0, 325.0), ("d", "evaluate", 320.0, 325.0)])
    second = run_record.update(path, cfg, 290.0, 330.0, run_record.jobs_since(metadata, 290.0))
    assert len(second["invocations"]) == 2 and second["invocations"][1]["jobs"] == 2  # d wrote two outputs
    assert second["job_seconds_by_rule"] == {"evaluate": 5.0, "rl": 30.0, "tiny_model": 60.0}
    assert second["jobs_by_rule"] == {"evaluate": 1, "rl": 2, "tiny_model": 1}
    assert second["wall_seconds"] == pytest.approx(120.0) and second["job_seconds"] == pytest.approx(95.0)
    assert second["seeds"] == {"seed": 0, "grid_seeds": [0, 1], "seeds_vary": ["rl"]}
    assert second["versions"]["torch"] and second["machine"]["cpus"]
    # an invocation with nothing to do adds nothing
    assert run_record.update(path, cfg, 400.0, 401.0, [])["invocations"] == second["invocations"]
    assert json.loads(path.read_text()) == run_record.update(path, cfg, 400.0, 401.0, [])
    # the results made again from scratch after the record: a record of its own
    again = run_record.update(path, cfg, 500.0, 530.0, [("rl", 20.0)], cores=2, fresh_since=450.0)
    assert len(again["invocations"]) == 1 and again["job_seconds"] == 20.0 and again["cores"] == 2


def test_each_part_names_the_code_that_ran_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run in two parts by two commits: each invocation keeps its own; the record names the last."""
    cfg, path = load_config(None, {"profile": "t"}), tmp_path / "run.json"
    git = {"rev-parse": "a" * 40, "status": ""}
    monkeypatch.setattr(run_record, "_git", lambda *args: git[args[0]])
    run_record.update(path, cfg, 100.0, 180.0, [("rl", 60.0)])
    git.update({"rev-parse": "b" * 40, "status": " M config/x.yaml"})
    record = run_record.update(path, cfg, 200.0, 260.0, [("trl_grpo", 50.0)])
    parts = [(run["commit"], run["dirty"]) for run in record["invocations"]]
    assert parts == [("a" * 40, False), ("b" * 40, True)]
    assert (record["commit"], record["dirty"]) == ("b" * 40, True)


def test_tables_rebuilt_by_another_commit_name_it(tmp_path: Path) -> None:
    """A run record of another commit gets the reporting code's commit as tables_by; a record of the
    code's own commit, or none, is left alone."""
    import subprocess

    from meml.reporting.run_record import note_tables_by

    project = Path(__file__).resolve().parents[1]
    done = subprocess.run(["git", "-C", str(project), "rev-parse", "HEAD"], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip("not a git checkout: no commit to name")
    head = done.stdout.strip()
    note_tables_by(tmp_path)  # no record: nothing written
    assert not (tmp_path / "run.json").exists()
    (tmp_path / "run.json").write_text(json.dumps({"commit": "0" * 40, "dirty": False}))
    note_tables_by(tmp_path)
    assert json.loads((tmp_path / "run.json").read_text()) == {"commit": "0" * 40, "dirty": False, "tables_by": head}
    (tmp_path / "run.json").write_text(json.dumps({"commit": head, "dirty": False}))
    note_tables_by(tmp_path)
    assert "tables_by" not in json.loads((tmp_path / "run.json").read_text())
