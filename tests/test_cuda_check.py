"""The CUDA check before money is spent (pipeline/meml/core/cuda_check.py), without a GPU: the
driver against torch's CUDA build, each refusal's message, and where it runs: scripts/setup.sh's gpu
route, the workflow's start, every GPU job's launcher, and scripts/gpu_check.py, which refuses
without --cpu where the GPU cannot be used."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import PROJECT

from meml import lifecycle
from meml.core import cuda_check
from meml.core.cuda_check import FIX_TORCH, problems, version_tuple


def test_the_driver_is_held_against_the_cuda_torch_was_built_for() -> None:
    assert version_tuple("580.65.06") == (580, 65, 6) and version_tuple("13.0") == (13, 0)
    assert problems("2.13.0", "13.0", "580.65.06", True) == []
    assert problems("2.13.0", "13.0", "590.48.01", True) == []
    assert problems("2.5.1", "12.4", "550.54.15", True) == []  # a CUDA 12 build on a 550 driver
    [old] = problems("2.13.0", "13.0", "575.57.08", True)
    assert old.startswith("the NVIDIA driver 575.57.08 is too old for torch 2.13.0, built for CUDA 13.0")
    assert "CUDA 13.x needs a driver >= 580" in old and "update the driver" in old
    assert problems("2.5.1", "12.4", "520.61.05", True)[0].startswith("the NVIDIA driver 520.61.05 is too old")


def test_each_refusal_says_what_is_wrong() -> None:
    [cpu_build] = problems("2.13.0+cpu", None, "580.65.06", False)
    assert "torch 2.13.0+cpu is a CPU build (torch.version.cuda is None)" in cpu_build and FIX_TORCH in cpu_build
    [no_driver] = problems("2.13.0", "13.0", None, False)
    assert no_driver.startswith("nvidia-smi reports no NVIDIA driver: torch 2.13.0 is built for CUDA 13.0")
    [unseen] = problems("2.13.0", "13.0", "580.65.06", False)
    assert unseen.startswith("torch.cuda.is_available() is False with torch 2.13.0 (CUDA 13.0) and driver 580.65.06")


def test_the_driver_version_is_nvidia_smis(monkeypatch: pytest.MonkeyPatch) -> None:
    def smi(args: list[str], **kwargs: Any) -> Any:
        assert args == ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        return SimpleNamespace(returncode=0, stdout="580.65.06\n580.65.06\n")

    monkeypatch.setattr(cuda_check.subprocess, "run", smi)
    assert cuda_check.driver_version() == "580.65.06"

    def missing(args: list[str], **kwargs: Any) -> Any:
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(cuda_check.subprocess, "run", missing)
    assert cuda_check.driver_version() is None


def test_this_cpu_machine_fails_the_check_naming_the_cpu_build() -> None:
    done = subprocess.run([sys.executable, "-m", "meml.core.cuda_check"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(PROJECT / "pipeline")})  # fmt: skip
    assert done.returncode == 1 and "CUDA check failed: torch" in done.stderr, done.stderr
    assert "is a CPU build" in done.stderr


def test_a_gpu_job_does_not_start_when_the_check_fails(tmp_path: Path) -> None:
    """Outside MEML_SIMULATE_GPUS the launcher checks the job's GPU first: on this CPU-only torch the
    job's command never runs, and the log says why."""
    marker = tmp_path / "ran"
    env = {k: v for k, v in os.environ.items() if k not in ("MEML_SIMULATE_GPUS", "SLURM_JOB_ID")}
    env.update(PYTHONPATH=str(PROJECT / "pipeline"), CUDA_VISIBLE_DEVICES="0", MEML_GPU_LOCKS=str(tmp_path / "locks"))
    cmd = [sys.executable, "-m", "meml.core.gpus", "1", "touch", str(marker)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 1 and not marker.exists()
    assert "CUDA check failed: torch" in done.stderr and "meml.gpus: not starting touch" in done.stderr


def _workflow(*gpus: int) -> Any:
    jobs = [SimpleNamespace(resources={"gpu": n}) for n in gpus]
    return SimpleNamespace(dag=SimpleNamespace(needrun_jobs=lambda: jobs))


def test_the_workflow_checks_before_its_first_gpu_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """lifecycle.start's check: a local run of a cuda config with GPU jobs to run stops before any
    job, naming the problem; nothing is checked on a CPU config, with pretend GPUs, or when no job
    left takes a GPU."""
    monkeypatch.delenv("MEML_SIMULATE_GPUS", raising=False)
    monkeypatch.setattr(cuda_check, "check", lambda: ["the NVIDIA driver 575.57.08 is too old"])
    with pytest.raises(ValueError, match="device: cuda, but the GPUs cannot be used; fix first:\n  the NVIDIA driver"):
        lifecycle.check_cuda(_workflow(0, 1), {"device": "cuda"})
    lifecycle.check_cuda(_workflow(0, 0), {"device": "cuda"})  # the report alone: no GPU job
    lifecycle.check_cuda(_workflow(1), {"device": "cpu"})
    monkeypatch.setenv("MEML_SIMULATE_GPUS", "2")
    lifecycle.check_cuda(_workflow(1), {"device": "cuda"})
    monkeypatch.delenv("MEML_SIMULATE_GPUS")
    monkeypatch.setattr(cuda_check, "check", lambda: [])
    lifecycle.check_cuda(_workflow(1), {"device": "cuda"})


def _gpu_check_module() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_check", PROJECT / "scripts" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_refuses_without_cpu(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    gpu_check = _gpu_check_module()
    monkeypatch.setattr(cuda_check, "check", lambda: ["torch 2.13.0+cpu is a CPU build (torch.version.cuda is None)"])
    monkeypatch.setattr(gpu_check, "build_probe", lambda *a, **k: pytest.fail("ran a check after the refusal"))
    monkeypatch.setattr(sys, "argv", ["gpu_check.py"])
    assert gpu_check.main() == 2
    said = capsys.readouterr().err
    assert "gpu_check: no usable GPU: torch 2.13.0+cpu is a CPU build" in said and "`--cpu` runs the CPU check" in said


def test_gpu_check_cpu_is_the_way_to_its_cpu_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """--cpu never asks about CUDA and runs the tiny model's checks (stubbed here; the real CPU run
    is tests/test_gpu_check.py)."""
    gpu_check = _gpu_check_module()
    monkeypatch.setattr(cuda_check, "check", lambda: pytest.fail("--cpu checked CUDA"))
    asked: list[str] = []
    monkeypatch.setattr(gpu_check, "update_memory_estimates", lambda: {"qwen2": {"total": 2**30, "line": "qwen2"}})
    monkeypatch.setattr(
        gpu_check, "build_probe", lambda root, arch: (asked.append(str(arch["vocab_size"])), root)[::-1]
    )
    rollouts = {"rollouts": 16, "tokens_per_second": 1.0, "vocabulary": 4096, "model_vocabulary": 4096,
                "sampled_beyond_trained_ids": 0}  # fmt: skip
    monkeypatch.setattr(gpu_check, "hf_throughput", lambda *a: rollouts)
    step = {"rows": [{"perf/step_seconds": 1.0, "perf/rollout_seconds": 0.5}], "peak_gib": None}
    monkeypatch.setattr(gpu_check, "timed_steps", lambda *a, **k: step)
    monkeypatch.setattr(gpu_check, "vllm_checks", lambda *a: {})
    out = tmp_path / "check.json"
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--cpu", "--out", str(out)])
    assert gpu_check.main() == 0
    report = json.loads(out.read_text())
    assert asked == ["4096"] and report["precision"] == "float32" and report["device"].startswith("CPU")


def _fake_setup(tmp_path: Path, gpu: bool) -> subprocess.CompletedProcess[str]:
    """scripts/setup.sh's gpu route in a copy of the project whose .venv/bin/python and nvidia-smi are
    stand-ins: pip does nothing, and the CUDA check fails as on a node with a 575 driver."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(PROJECT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / "bin").mkdir()
    python = tmp_path / ".venv" / "bin" / "python"
    python.write_text(
        "#!/bin/bash\n"
        'case "$*" in\n'
        '  *"pip show"*) exit 1 ;;\n'
        '  *"meml.core.cuda_check"*) echo "CUDA check failed: the NVIDIA driver 575.57.08 is too old" >&2; exit 1 ;;\n'
        "  *) exit 0 ;;\n"
        "esac\n"
    )
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.write_text("#!/bin/bash\n" + ('echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"\n' if gpu else "exit 9\n"))
    for script in (python, smi):
        script.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "MEML_SETUP_ROUTE": "gpu"}
    env.pop("MEML_SETUP_DRY_RUN", None)
    return subprocess.run(["bash", "scripts/setup.sh"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_the_setup_gpu_route_fails_where_the_gpu_cannot_be_used(tmp_path: Path) -> None:
    done = _fake_setup(tmp_path, gpu=True)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the NVIDIA driver 575.57.08 is too old" in done.stderr
    assert "the gpu route installed, but the GPUs cannot be used as they stand" in done.stderr


def test_the_setup_gpu_route_on_a_login_node_leaves_the_check_to_the_jobs(tmp_path: Path) -> None:
    done = _fake_setup(tmp_path, gpu=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no GPU here (route forced): CUDA is checked by each GPU job on its node" in done.stdout


def test_the_gpu_routes_plan_names_the_check() -> None:
    env = {**os.environ, "MEML_SETUP_ROUTE": "gpu", "MEML_SETUP_DRY_RUN": "plan"}
    run = subprocess.run(["bash", "scripts/setup.sh"], cwd=PROJECT, env=env, capture_output=True, text=True)
    assert run.returncode == 0 and "would run: python -m meml.core.cuda_check" in run.stdout
