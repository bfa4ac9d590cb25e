"""GPU placement (pipeline/meml/core/gpus.py): each job takes GPUs of its own by file locks, waits
while none is free, keeps SLURM's placement, and the warm worker stays off on a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PROJECT

from meml import worker
from meml.core import gpus


def _job(tmp: Path, n: int, *command: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": str(PROJECT / "pipeline"), "MEML_SIMULATE_GPUS": "2",
               "MEML_GPU_LOCKS": str(tmp / "locks"), "MEML_GPU_LOG": str(tmp / "gpus.jsonl"), **env}  # fmt: skip
    if "SLURM_JOB_ID" not in env:
        environ.pop("SLURM_JOB_ID", None)
    cmd = [sys.executable, "-m", "meml.core.gpus", str(n), *command]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=environ)


def test_a_job_gets_free_gpus_and_waits_while_none_is_free(tmp_path: Path) -> None:
    echo = ("sh", "-c", "echo $CUDA_VISIBLE_DEVICES $MEML_DEVICES")
    assert _job(tmp_path, 1, *echo).stdout.split() == ["0", "0"]
    assert _job(tmp_path, 2, *echo).stdout.split() == ["0,1", "0,1"]
    held, fds = gpus.take(1, ["0", "1"], tmp_path / "locks")  # another job holds GPU 0
    assert held == ["0"]
    assert _job(tmp_path, 1, *echo).stdout.split() == ["1", "1"]
    more, more_fds = gpus.take(1, ["0", "1"], tmp_path / "locks")  # and now GPU 1: none is free
    assert more == ["1"]
    with pytest.raises(subprocess.TimeoutExpired):
        _job(tmp_path, 1, *echo, timeout=3)
    os.close(fds[0])  # GPU 0 is given back
    assert _job(tmp_path, 1, *echo).stdout.split() == ["0", "0"]
    os.close(more_fds[0])
    with pytest.raises(SystemExit, match="needs 3 GPU"):
        gpus.take(3, ["0", "1"], tmp_path / "locks")


def test_the_job_s_exit_code_and_record_come_through(tmp_path: Path) -> None:
    assert _job(tmp_path, 1, "sh", "-c", "exit 3").returncode == 3
    [record] = [line for line in (tmp_path / "gpus.jsonl").read_text().splitlines()]
    assert '"returncode": 3' in record and '"devices": "0"' in record
    assert _job(tmp_path, 0, "sh", "-c", "echo ${CUDA_VISIBLE_DEVICES:-none}").stdout.strip() == "none"


def test_slurm_placement_is_kept(tmp_path: Path) -> None:
    done = _job(tmp_path, 1, "sh", "-c", "echo $CUDA_VISIBLE_DEVICES", SLURM_JOB_ID="7", CUDA_VISIBLE_DEVICES="3")
    assert done.stdout.strip() == "3" and not (tmp_path / "locks").exists()


def test_the_warm_worker_stays_off_on_a_gpu(tmp_path: Path) -> None:
    assert worker.start(tmp_path / "w.sock", device="cuda") is None
