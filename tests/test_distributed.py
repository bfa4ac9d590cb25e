"""Data parallelism on two CPU processes (gloo), started as on GPUs by `accelerate launch`:
SFT and every RL method run to the end, each question's rollouts stay together for IML and the
buffer, the replicas and their buffers stay identical, and one set of outputs is written."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PROJECT

from meml.core.config import load_config
from meml.data.experts import DEFAULT_PROMPTS
from meml.data.tiny_models import build_tiny_models, toy_corpus

pytestmark = pytest.mark.slow  # `pytest -m "not slow"` for a quick round

G = 6  # the worker's group size


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def two_process_run(small_world: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    base = build_tiny_models(toy_corpus(small_world, DEFAULT_PROMPTS), out / "base", seed=0, vocab_size=500)["qwen2"]
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(PROJECT / "config/accelerate/cpu_gloo.yaml"),
        "--num_processes", "2", "--main_process_port", str(_free_port()),
        str(PROJECT / "tests/dist_worker.py"), str(small_world), str(base), str(out),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def test_both_processes_finish_sft_and_write_one_model(two_process_run: Path) -> None:
    for rank in (0, 1):
        assert json.loads((two_process_run / f"rank{rank}.json").read_text()) == {"sft_processes": 2}
    assert (two_process_run / "sft/model/config.json").is_file()
    assert not (two_process_run / "sft/work").exists()


def test_every_method_keeps_groups_whole_and_replicas_identical(two_process_run: Path) -> None:
    cfg = load_config()
    runs = [*cfg["grid"]["methods"], "MoE-SFT-GRPO+DS", "MEML-per_expert", "scripted"]
    assert sorted(p.name for p in (two_process_run / "rl").iterdir()) == sorted(runs)
    for name in runs:
        run = two_process_run / "rl" / name
        summary = json.loads((run / "DONE").read_text())
        assert summary["processes"] == 2 and summary["steps"] == 2, name
        lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        assert [m["step"] for m in lines] == [0, 1], name  # one writer: no duplicated steps
        n_experts = len(cfg["methods"].get(name, cfg["methods"]["MEML-GRPO"])["rl_experts"])
        group = G * n_experts if name == "MEML-per_expert" else G
        for m in lines:
            # IML and the buffer work per question: each process saw all of its questions' rollouts
            assert m["groups/rollouts_min"] == m["groups/rollouts_max"] == group, name
            assert m["dist/replicas_identical"] == 1.0 and m["dist/buffers_identical"] == 1.0, name
            assert m["dist/processes"] == 2.0
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000001", "step-000002"], name
        assert (run / "model/config.json").is_file()


def test_iml_and_the_buffer_see_every_question_of_both_processes(two_process_run: Path) -> None:
    lines = [json.loads(x) for x in (two_process_run / "rl/scripted/metrics.jsonl").read_text().splitlines()]
    for m in lines:
        # one question per process, expert 1 right and experts 0 and 2 wrong on each: one IML pair per
        # question, and two hard offers per question gathered into the shared buffer (capacity 2)
        assert m["iml/pairs"] == 2.0 and m["loss/iml"] != 0
        assert m["reward/expert1"] == 1.0 and m["reward/expert0"] == 0.0
    assert sum(m["hsft/flushes"] > 0 for m in lines) >= 1 and any(m["hsft/sft_examples"] == 2.0 for m in lines)
