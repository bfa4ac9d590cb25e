"""No finished run is lost, reruns do what they say, damaged files get one clear line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PROJECT
from scripted import scripted_engine, train
from test_rl import METHODS, tiny_settings

from meml.core.io import DataError, read_jsonl
from meml.core.tracking import read_metrics
from meml.training import checkpoint
from meml.training.rl import Method


def _run(world: Path, model: Path, out: Path, **changes: object) -> dict:
    data = world / "data/gsm8k"
    engine = scripted_engine(model, data)
    method = Method.from_config("MEML-GRPO", METHODS["MEML-GRPO"])
    settings = tiny_settings(**changes)
    return train(settings, method, model, data, world / "experts/gsm8k", out, engine=engine, progress=False,
                  params={"rl": settings})  # fmt: skip


@pytest.fixture(scope="module")
def base_model(small_world: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from meml.data.experts import DEFAULT_PROMPTS
    from meml.data.tiny_models import build_tiny_models, toy_corpus

    out = tmp_path_factory.mktemp("rel_models")
    return build_tiny_models(toy_corpus(small_world, DEFAULT_PROMPTS), out, seed=0, vocab_size=500)["qwen2"]


def test_an_invalid_rerun_never_touches_the_finished_run(small_world: Path, base_model: Path, tmp_path: Path) -> None:
    _run(small_world, base_model, tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and ".lock" not in p.name}
    with pytest.raises(DataError, match=r"'rl\.group_size'"):
        _run(small_world, base_model, tmp_path, group_size=2)  # other values, and invalid
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and ".lock" not in p.name}
    assert after == before


def test_changed_values_move_the_old_run_aside(small_world: Path, base_model: Path, tmp_path: Path) -> None:
    _run(small_world, base_model, tmp_path)
    _run(small_world, base_model, tmp_path, lr=1e-3)
    [aside] = (tmp_path / "previous").iterdir()
    assert (aside / "DONE").is_file() and (aside / "model/config.json").is_file()
    assert json.loads((tmp_path / "cell.json").read_text())["rl"]["lr"] == 1e-3


def test_a_forced_rerun_trains_again(small_world: Path, base_model: Path, tmp_path: Path) -> None:
    _run(small_world, base_model, tmp_path)
    (tmp_path / "DONE").unlink()  # what snakemake --forcerun does
    _run(small_world, base_model, tmp_path)
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == 2  # both steps trained again, not 0
    assert (next((tmp_path / "previous").iterdir()) / "metrics.jsonl").is_file()


def test_without_kept_checkpoints_a_finished_cell_keeps_its_model_and_a_forced_rerun_trains_again(
    small_world: Path, base_model: Path, tmp_path: Path
) -> None:
    kept = tmp_path / "kept"
    _run(small_world, base_model, kept)
    _run(small_world, base_model, tmp_path / "run", keep_checkpoints=False)
    run = tmp_path / "run"
    assert (kept / "checkpoints").is_dir() and not (run / "checkpoints").exists()
    assert (run / "DONE").is_file() and (run / "model/config.json").is_file()
    assert checkpoint.newest_marked(kept / "checkpoints") is not None
    # the same model either way: the switch removes files, it changes no result
    assert (run / "model/model.safetensors").read_bytes() == (kept / "model/model.safetensors").read_bytes()
    (run / "DONE").unlink()  # snakemake --forcerun: no checkpoint says the run had finished, its model does
    _run(small_world, base_model, run, keep_checkpoints=False)
    assert len(read_metrics(run / "metrics.jsonl")) == 2
    [aside] = (run / "previous").iterdir()
    assert (aside / "model/config.json").is_file() and (aside / "metrics.jsonl").is_file()


HOLD = (  # a process that holds a run folder's lock for a minute
    "from meml.core.io import run_lock\nimport time\nwith run_lock({folder!r}):\n"
    "    print('held', flush=True); time.sleep(60)"
)


def test_a_second_writer_is_refused_while_the_first_lives(small_world: Path, base_model: Path, tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD.format(folder=str(tmp_path))],
        stdout=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": str(PROJECT / "pipeline")},
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    with pytest.raises(DataError, match=rf"another process \(pid {holder.pid}\) is writing here"):
        _run(small_world, base_model, tmp_path)
    assert not (tmp_path / "metrics.jsonl").exists()
    holder.kill()  # SIGKILL: the OS releases the lock
    holder.wait()
    _run(small_world, base_model, tmp_path)
    assert (tmp_path / "DONE").is_file()


def test_a_damaged_newest_checkpoint_is_skipped(
    small_world: Path, base_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clean = tmp_path / "clean"
    _run(small_world, base_model, clean, steps=3)
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        data = small_world / "data/gsm8k"
        settings = tiny_settings(steps=3)
        engine = scripted_engine(base_model, data)
        train(settings, Method.from_config("MEML-GRPO", METHODS["MEML-GRPO"]), base_model, data,
               small_world / "experts/gsm8k", run, engine=engine, progress=False, params={"rl": settings},
               stop_after=2)  # fmt: skip
    newest = checkpoint.latest(run / "checkpoints")
    assert newest is not None and newest.name == "step-000002"
    state = newest / "state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])  # a full disk, a bad copy
    assert checkpoint.latest(run / "checkpoints").name == "step-000001"
    said = capsys.readouterr().err
    assert "skipping checkpoint" in said and "does not match its checksum" in said
    with pytest.raises(DataError, match=r"state.pt: checkpoint cannot be read"):
        checkpoint.load(newest)
    _run(small_world, base_model, run, steps=3)
    import torch
    from transformers import AutoModelForCausalLM

    a = AutoModelForCausalLM.from_pretrained(clean / "model").state_dict()
    b = AutoModelForCausalLM.from_pretrained(run / "model").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)  # resumed from step 1: the same run


def test_damaged_files_get_one_line_naming_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "train.jsonl"
    bad.write_bytes(b'{"question": "ok"}\n{"question": "caf\xe9"}\n')
    with pytest.raises(DataError, match=r"train.jsonl, line 2: not UTF-8 \(byte 0xe9"):
        read_jsonl(bad)
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 0, "a": 1}\n{"step": 1, "a"\n{"step": 2, "a": 3}\n')
    with pytest.raises(DataError, match=r"metrics.jsonl, line 2: not valid JSON"):
        read_metrics(metrics)
    metrics.write_text('{"step": 0, "a": 1}\n{"step": 1, "a"')  # torn last line: a kill mid-write
    assert read_metrics(metrics) == [{"step": 0, "a": 1}]


def test_duplicate_gsm8k_questions_are_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from meml.data.loaders import normalise_gsm8k

    row = {"question": "How much?", "answer": "5\n#### 5"}
    records = normalise_gsm8k([(1, row), (2, {"question": "Other?", "answer": "#### 1"}), (3, row)], "train", "t.jsonl")
    assert len(records) == 3
    assert "1 question(s) appear more than once (1 extra row(s); e.g. lines 1, 3)" in capsys.readouterr().err
