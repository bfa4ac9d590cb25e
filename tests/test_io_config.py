from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml
from conftest import PROJECT

from meml.cli import main
from meml.core.config import load_config
from meml.core.io import DataError, atomic_open, atomic_write_text


def test_atomic_write_leaves_nothing_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    atomic_write_text(target, "old\n")
    with pytest.raises(RuntimeError), atomic_open(target) as handle:
        handle.write("half")
        raise RuntimeError("interrupted")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's private 0600


def test_default_config_fills_defaults() -> None:
    cfg = load_config()
    assert cfg["profile"] == "toy" and cfg["reward"]["mode"] == "lenient"
    assert cfg["toy"]["sizes"]["gsm8k"] == [300, 50]
    assert cfg["grid"]["seeds"] == [0] and cfg["mlflow"]["experiment"] is None  # schema defaults


def test_config_errors_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"field 'toy'.*'sizez' was unexpected"):
        load_config(overrides={"toy.sizez": 1})
    with pytest.raises(DataError, match=r"field 'reward.mode'"):
        load_config(overrides={"reward.mode": "loose"})
    missing = tmp_path / "nope.yaml"
    with pytest.raises(DataError, match="config file not found"):
        load_config(missing)


def test_cli_reports_bad_input_without_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["prepare", "--dataset", "svamp", "--out", str(tmp_path)]) == 2
    assert "unknown data set 'svamp'" in capsys.readouterr().err
    assert main(["prepare", "--dataset", "gsm8k", "--local", str(tmp_path / "none"), "--out", str(tmp_path)]) == 2
    assert "local folder for gsm8k not found" in capsys.readouterr().err


def test_defaults_have_one_home_the_default_config() -> None:
    """config/default.yaml holds every key's value (and the reason for it); the schema holds none for
    a fixed key, so the two cannot drift, and every fixed key the schema allows has its value there.
    The schema's own defaults are those of a named entry's fields (a method added by a config)."""
    schema = yaml.safe_load((PROJECT / "config/schema.yaml").read_text())
    default = yaml.safe_load((PROJECT / "config/default.yaml").read_text())
    doubled: list[str] = []
    valueless: list[str] = []

    def walk(node: dict, path: str, values: object) -> None:
        for key, sub in node.get("properties", {}).items():
            if "default" in sub:
                doubled.append(f"{path}{key}")
            if not isinstance(values, dict) or key not in values:
                valueless.append(f"{path}{key}")
                continue
            walk(sub, f"{path}{key}.", values[key])

    walk(schema, "", default)
    assert not doubled, f"schema defaults for keys config/default.yaml holds: {doubled}"
    # keys whose absence is their meaning: no stages runs, the built-in expert prompts
    optional = {"report.stages.pretrain", "report.stages.sft", "report.stages.rl", "experts.prompts"}
    unset = sorted(set(valueless) - optional)
    assert not unset, f"keys without a value in config/default.yaml: {unset}"


def test_every_shipped_config_validates_and_names_existing_profiles() -> None:
    """Each config/*.yaml, laid over the default, passes the schema; every profile a report is told
    to read beside its own (report.replicates, report.stages) is made by a shipped config or by a
    Makefile recipe's command line (`make study` runs the replica as `--config ... profile=...`), so
    renaming one cannot leave a report pointing at a run nobody makes."""
    files = sorted(p for p in (PROJECT / "config").glob("*.yaml") if p.name not in ("schema.yaml", "default.yaml"))
    assert len(files) >= 7
    makefile = (PROJECT / "Makefile").read_text()
    profiles = {load_config(path)["profile"] for path in files}
    profiles |= set(re.findall(r"profile=([\w.-]+)", makefile))
    for path in files:
        report = yaml.safe_load(path.read_text()).get("report") or {}
        named = [*(report.get("replicates") or []), *(report.get("stages") or {}).values()]
        missing = [name for name in named if name not in profiles]
        assert not missing, f"{path.name} names runs no shipped config or recipe makes: {missing}"
    assert {"toy-study", "toy-study-replica", "quick"} <= profiles


def test_the_real_learn_recipe_lays_over_the_real_model_recipe() -> None:
    """`make real-learn`'s two commands: config/real-learn.yaml over config/real-model.yaml, the first
    without trl's run (--config trl='{methods: []}'), the second with it; the same cells in both."""
    from meml.core.config import DEFAULT_CONFIG, deep_merge, validate
    from meml.plan import grid

    layers = [DEFAULT_CONFIG, PROJECT / "config/real-model.yaml", PROJECT / "config/real-learn.yaml"]
    merged: dict = {}
    for path in layers:
        merged = deep_merge(merged, yaml.safe_load(path.read_text()))
    second = validate(merged, "real-learn")
    first = validate(deep_merge(merged, {"trl": {"methods": []}}), "real-learn")
    assert second["trl"]["methods"] == ["Expert1-SFT-GRPO"] and first["trl"]["methods"] == []
    assert second["rl"]["engine"] == "vllm" and second["eval"]["backend"] == "vllm" and second["eval"]["sft"]
    assert second["eval"]["questions"] >= 300 and second["profile"] == "real-learn"
    assert [grid.cell_values(first, c) for c in grid.cells(first)] == [
        grid.cell_values(second, c) for c in grid.cells(second)
    ]
    assert "trl='{methods: []}'" in (PROJECT / "Makefile").read_text()
