"""The paper's grid on a rented 8-GPU node, scheduled on a CPU: Snakemake's own scheduler over the
paper config's DAG under the documented command (`--cores 16 --resources gpu=8`), every job a
stand-in (tests/standin_snakemake.py) on 8 pretend GPUs (MEML_SIMULATE_GPUS=8)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import PAPER_DATA_PINS, PROJECT

from meml.core.config import load_config

pytestmark = pytest.mark.slow  # a few Snakemake runs of the paper config's DAG, seconds of stand-ins each

PAPER = [str(PROJECT / "config/paper.yaml"), str(PAPER_DATA_PINS)]
NODE = ["--cores", "16", "--resources", "gpu=8"]  # the documented command's
METHODS = load_config(PROJECT / "config/paper.yaml")["grid"]["methods"]
# every RL cell of both models on GSM8K: four SFT runs, then fourteen RL jobs that could run at once
RL_GSM8K = [f"results/paper/rl/{m}/gsm8k/{method}/seed0/DONE" for m in ("qwen2", "llama") for method in METHODS]


Jobs = list[dict[str, Any]]


def _standin(
    folder: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], Jobs]:
    """Snakemake on the workflow in `folder` with stand-in jobs (a GPU job sleeps 2 s): its result,
    and a record a job {rule, threads, gpu, start, end, output}."""
    folder.mkdir(parents=True, exist_ok=True)
    record = folder / "standin-jobs.jsonl"
    cmd = [sys.executable, str(PROJECT / "tests/standin_snakemake.py"), str(record), "2", "--snakefile",
           str(PROJECT / "Snakefile"), "--directory", str(folder), "--configfile", *PAPER, *args]  # fmt: skip
    clean = {k: v for k, v in os.environ.items() if k != "MEML_SIMULATE_GPUS"}
    environ = {**clean, "HF_TOKEN": "hf_placeholder", "MEML_GPU_LOCKS": str(folder / "gpu-locks"), **(env or {})}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=folder, env=environ)
    jobs = [json.loads(line) for line in record.read_text().splitlines()] if record.is_file() else []
    return done, jobs


def _most_at_once(jobs: list[dict[str, Any]]) -> int:
    """The most jobs whose [start, end) overlapped at one moment."""
    events = sorted([(j["start"], 1) for j in jobs] + [(j["end"], -1) for j in jobs])  # an end before a start
    running = most = 0
    for _, change in events:
        running += change
        most = max(most, running)
    return most


def test_eight_gpu_jobs_run_at_once_under_the_documented_command(tmp_path: Path) -> None:
    """Fourteen RL cells ready together after four SFT runs, under `--cores 16 --resources gpu=8`:
    eight GPU jobs run at once, each with 2 threads (16 cores / 8 GPUs; `threads: 8` would let two
    run), each on a pretend GPU of its own. The API teachers hold one thread and no GPU. Each SFT
    run starts after its model's trajectories were checked against RL's cap, which starts after
    the teachers."""
    gpus = {"MEML_SIMULATE_GPUS": "8"}
    done, jobs = _standin(tmp_path, *NODE, "--", *RL_GSM8K, env=gpus)
    assert done.returncode == 0, done.stderr[-4000:]
    on_gpus = [j for j in jobs if j["gpu"]]
    assert {j["rule"] for j in on_gpus} == {"sft", "rl"} and len(on_gpus) == 4 + 14
    assert _most_at_once(on_gpus) == 8
    assert {j["threads"] for j in on_gpus} == {2}
    teachers = [j for j in jobs if j["rule"] == "teacher_trajectories"]
    assert len(teachers) == 2 and all(j["threads"] == 1 and j["gpu"] == 0 for j in teachers), teachers
    # the pretend GPUs as meml.core.gpus placed them: one a job, never one for two jobs at once
    placed = [json.loads(x) for x in (tmp_path / "logs/paper/gpus.jsonl").read_text().splitlines()]
    assert len(placed) == len(on_gpus) and all(r["devices"] in {str(k) for k in range(8)} for r in placed)
    for i, a in enumerate(placed):
        for b in placed[i + 1 :]:
            assert not (a["start"] < b["end"] and b["start"] < a["end"] and a["devices"] == b["devices"]), (a, b)
    # the check of the trajectories' lengths: after the teachers, before SFT
    # results/paper/real/lengths/<model>/gsm8k.json
    checked = {j["output"][0].split("/")[4]: j for j in jobs if j["rule"] == "trajectory_lengths"}
    assert set(checked) == {"qwen2", "llama"}
    assert all(c["start"] >= max(t["end"] for t in teachers) for c in checked.values())
    for sft in (j for j in jobs if j["rule"] == "sft"):
        model = sft["output"][0].split("/")[3]
        assert sft["start"] >= checked[model]["end"], (sft, checked[model])
