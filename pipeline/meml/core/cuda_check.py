"""Can the installed torch use this machine's GPUs? Checked before money is spent on them.

    python -m meml.core.cuda_check     # one line; exit 0 when it can, 1 naming what is wrong

Three things, each named when it fails:
    torch is a CUDA build        torch.version.cuda is set (a CPU wheel on a GPU node runs every job
                                 on the CPU, or not at all)
    the driver is new enough     nvidia-smi's driver version at or above the minimum for the CUDA
                                 major version torch was built with (MINIMUM_DRIVER); the GPU lock
                                 (requirements-gpu.lock) pins CUDA 13 wheels, which need a 580 driver
    torch sees a GPU             torch.cuda.is_available()

Who runs it: scripts/setup.sh's gpu route after installing; the workflow's start (lifecycle.start)
on a local run of a cuda config with GPU jobs to run, before any job; and every GPU job's launcher
(core/gpus.py) on its own GPUs before the job starts, which covers a cluster's nodes. Never with
MEML_SIMULATE_GPUS (pretend GPUs on a CPU).
"""

from __future__ import annotations

import subprocess
import sys

# The oldest driver that runs a CUDA major version's binaries, by minor version compatibility:
# CUDA 13.x >= 580, 12.x >= 525, 11.x >= 450 (NVIDIA, "CUDA Compatibility: Minor Version
# Compatibility", table 1: https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html)
MINIMUM_DRIVER = {13: 580, 12: 525, 11: 450}
FIX_TORCH = "run `MEML_SETUP_ROUTE=gpu make setup` (scripts/setup.sh's gpu route installs the CUDA build)"


def version_tuple(text: str) -> tuple[int, ...]:
    """'580.65.06' -> (580, 65, 6); what is not a number ends it."""
    out = []
    for part in text.strip().split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


def driver_version() -> str | None:
    """The NVIDIA driver's version as nvidia-smi reports it, or None without nvidia-smi or a GPU."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    return lines[0] if done.returncode == 0 and lines else None


def problems(torch_version: str, torch_cuda: str | None, driver: str | None, available: bool) -> list[str]:
    """What keeps torch `torch_version` (built for CUDA `torch_cuda`, None for a CPU build) from this
    machine's GPUs, with driver `driver` (None: no nvidia-smi answer) and torch.cuda.is_available();
    empty when nothing does."""
    if torch_cuda is None:
        return [f"torch {torch_version} is a CPU build (torch.version.cuda is None): {FIX_TORCH}"]
    if driver is None:
        return [f"nvidia-smi reports no NVIDIA driver: torch {torch_version} is built for CUDA {torch_cuda}, "
                "which needs one (is this a GPU machine?)"]  # fmt: skip
    major = version_tuple(torch_cuda)[:1]
    need = MINIMUM_DRIVER.get(major[0]) if major else None
    have = version_tuple(driver)
    if need is not None and (not have or have[0] < need):
        return [
            f"the NVIDIA driver {driver} is too old for torch {torch_version}, built for CUDA {torch_cuda}: "
            f"CUDA {major[0]}.x needs a driver >= {need} (core/cuda_check.MINIMUM_DRIVER); update the driver"
        ]
    if not available:
        return [
            f"torch.cuda.is_available() is False with torch {torch_version} (CUDA {torch_cuda}) and driver "
            f"{driver}: no GPU is usable here (CUDA_VISIBLE_DEVICES, the driver's state: `nvidia-smi`)"
        ]
    return []


def check() -> list[str]:
    """problems() of this machine and the installed torch."""
    import torch

    return problems(torch.__version__, torch.version.cuda, driver_version(), torch.cuda.is_available())


def main() -> int:
    found = check()
    if found:
        for problem in found:
            print(f"CUDA check failed: {problem}", file=sys.stderr)
        return 1
    import torch

    print(f"CUDA check: torch {torch.__version__} (CUDA {torch.version.cuda}), driver {driver_version()}, "
          f"{torch.cuda.device_count()} GPU(s) usable")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
