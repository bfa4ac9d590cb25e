"""The paper's grid on a rented 8-GPU node, scheduled on a CPU: Snakemake's own scheduler over the
paper config's DAG under the documented command (`--cores 16 --resources gpu=8`), every job a
stand-in (tests/standin_snakemake.py) on 8 pretend GPUs (MEML_SIMULATE_GPUS=8). And the teacher
stage before the rental: alone on a machine without a GPU, carried to the node, refused there."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import PAPER_DATA_PINS, PROJECT

from meml.core.config import load_config
from meml.plan import teacher_stage

pytestmark = pytest.mark.slow  # a few Snakemake runs of the paper config's DAG, seconds of stand-ins each

PAPER = [str(PROJECT / "config/paper.yaml"), str(PAPER_DATA_PINS)]
NODE = ["--cores", "16", "--resources", "gpu=8"]  # the documented command's
METHODS = load_config(PROJECT / "config/paper.yaml")["grid"]["methods"]
# every RL cell of both models on GSM8K: four SFT runs, then fourteen RL jobs that could run at once
RL_GSM8K = [f"results/paper/rl/{m}/gsm8k/{method}/seed0/DONE" for m in ("qwen2", "llama") for method in METHODS]
TEACHER_STAGE = {
    "hub_model",
    "mlflow_store",
    "prepare_real",
    "gold_expert",
    "teacher_trajectories",
    "trajectory_lengths",
}


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
    clean = {k: v for k, v in os.environ.items() if k not in ("MEML_SIMULATE_GPUS", teacher_stage.OVERRIDE)}
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
    run), each on a pretend GPU of its own. The API teachers, run on the node because
    MEML_TEACHERS_ON_GPU_NODE=1 says so, hold one thread and no GPU. Each SFT run starts after
    its model's trajectories were checked against RL's cap, which starts after the teachers."""
    gpus = {"MEML_SIMULATE_GPUS": "8", teacher_stage.OVERRIDE: "1"}
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


def test_the_teacher_stage_runs_alone_without_a_gpu_and_the_node_refuses_to_run_it(tmp_path: Path) -> None:
    """`snakemake ... teachers` (make teachers) on a machine without a GPU runs the teacher stage and
    nothing after it. On the GPU node before the results are carried there, the documented command
    refuses to start the teachers, before any job, saying why and how to override it; once `meml
    carry` (make carry) has copied them, the node's dry run lists no job of that stage."""
    cpu, node = tmp_path / "cpu", tmp_path / "node"
    done, jobs = _standin(cpu, "--cores", "16", "--", "teachers")
    assert done.returncode == 0, done.stderr[-4000:]
    assert {j["rule"] for j in jobs} == {*TEACHER_STAGE, "teachers"} and not any(j["gpu"] for j in jobs)
    assert sum(j["rule"] == "teacher_trajectories" for j in jobs) == 6  # two API teachers, three data sets
    assert sum(j["rule"] == "trajectory_lengths" for j in jobs) == 6  # two models, three data sets

    simulated = {"MEML_SIMULATE_GPUS": "8"}
    refused, ran = _standin(node, *NODE, "--", *RL_GSM8K[:1], env=simulated)
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0 and not ran and not (node / "results").exists()
    assert "would start 2 teacher job(s) on a machine with 8 GPU(s): teachers.e1 on gsm8k, teachers.e2 on gsm8k" in said
    assert "every SFT job waits on the teachers, so the GPUs would idle" in said
    assert "make teachers CONFIG=" in said and "make carry CONFIG=" in said and f"{teacher_stage.OVERRIDE}=1" in said

    carry = subprocess.run(
        [sys.executable, "-m", "meml.cli", "carry", "--configfile", *PAPER, "--to", f"{node}", "--print"],
        capture_output=True, text=True, cwd=cpu, timeout=600,
    )  # fmt: skip
    assert carry.returncode == 0, carry.stderr
    command = shlex.split(carry.stdout.strip().splitlines()[-1])
    assert command[:2] == ["rsync", "-aR"] and command[-1] == f"{node}/"
    paths = command[3:-1]
    assert {"results/paper", ".snakemake/metadata", "logs/paper"} <= set(paths), paths
    if shutil.which("rsync"):
        subprocess.run(command, cwd=cpu, check=True, capture_output=True)
    else:  # what rsync -aR does for a new folder: each path kept relative, with its times
        subprocess.run(["cp", "-a", "--parents", *paths, f"{node}/"], cwd=cpu, check=True)
    dry = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--snakefile", str(PROJECT / "Snakefile"), "--directory", str(node),
         "--configfile", *PAPER, *NODE, "--", *RL_GSM8K],
        capture_output=True, text=True, cwd=node, timeout=600, env={**os.environ, "HF_TOKEN": "x", **simulated},
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr[-3000:]
    listed = set(re.findall(r"^(\w+)\s+\d+$", dry.stdout, re.M)) - {"total", "job"}
    assert listed == {"sft", "rl"}, listed


def test_the_refusal_names_api_teachers_only_and_gives_way_to_the_override(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(PROJECT / "config/paper.yaml")
    cfg["teachers"]["e3"] = {"backend": "jsonl", "path": "mine"}
    cfg["teachers"]["e4"] = {"backend": "openai", "standin": True}
    jobs = [("teacher_trajectories", {"k": str(k), "ds": "gsm8k"}) for k in (1, 2, 3, 4)] + [("sft", {"model": "x"})]
    monkeypatch.delenv(teacher_stage.OVERRIDE, raising=False)
    said = teacher_stage.refusal(cfg, jobs, 8, ["config/paper.yaml"])
    assert said and "start 2 teacher job(s)" in said and "teachers.e3" not in said and "teachers.e4" not in said
    assert "make teachers CONFIG=config/paper.yaml" in said
    assert teacher_stage.refusal(cfg, jobs, 0, []) is None  # no GPU here: the place to run them
    assert teacher_stage.refusal(cfg, jobs[2:], 8, []) is None  # a file and the local stand-in wait on nothing
    monkeypatch.setenv(teacher_stage.OVERRIDE, "1")
    assert teacher_stage.refusal(cfg, jobs, 8, []) is None
