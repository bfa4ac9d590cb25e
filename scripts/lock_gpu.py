"""Regenerate requirements-gpu.lock, the pins of scripts/setup.sh's GPU route, from two pip resolutions.

    .venv/bin/python scripts/lock_gpu.py    # a few minutes: pip reads wheel metadata, installs nothing

1. `.[dev,gpu]` with PyPI's (CUDA) torch, constrained by requirements.lock less the pins that vLLM 0.32.0
   rules out: transformers (it needs < 5.20), fastapi (< 0.137) and numpy (mistral-common[image], which
   vLLM needs, asks < 2.4 on Python <= 3.12). pip meets every requirement of this set.
2. `.[dev,cluster]` constrained by step 1's pins less numpy. The cluster extra's SLURM plugin asks
   numpy >= 2.4.5, which step 1 rules out, so no single resolution holds all three extras; its
   packages go in a section of their own, installed with --no-deps (the plugin uses numpy for np.inf).
The pins are Linux x86_64 and Python 3.11 ones: run it there.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
LOCK = PROJECT / "requirements-gpu.lock"
DROPPED = {"transformers", "fastapi", "numpy"}  # requirements.lock pins vLLM 0.32.0 rules out
# `torch==2.13.0` alone also takes a local torch-2.13.0+cpu wheel (find-links); PyPI's Linux torch is CUDA's
TORCH = "torch==2.13.0,!=2.13.0+cpu"

HEADER = """\
# GPU route of scripts/setup.sh (Linux x86_64, Python 3.11, CUDA): vLLM 0.32.0 and what it needs.
# Made by scripts/lock_gpu.py from pip's resolution (--dry-run --report) of the project's extras
# under requirements.lock's pins, less transformers, fastapi and numpy, which vLLM 0.32.0 rules out
# (transformers 5.19 here, 5.20.2 on the CPU route). Do not edit: rerun the script.
"""
CLUSTER = """\
# The cluster extra, beyond the pins above: snakemake-executor-plugin-slurm asks numpy >= 2.4.5,
# which vLLM's mistral-common[image] rules out (< 2.4), so setup.sh installs these with --no-deps
# and that one pin stays unmet (the plugin uses numpy for np.inf in its efficiency report only).
"""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path) -> dict[str, str]:
    """A lock file's `name==version` lines as {name: version}."""
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return dict(line.split("==", 1) for line in lines if line)


def resolve(extras: str, constraints: dict[str, str], folder: Path) -> dict[str, str]:
    """What pip would install for the project with `extras` under `constraints`, less the project itself."""
    pins, report = folder / f"{extras}.txt", folder / f"{extras}.json"
    pins.write_text("".join(f"{name}=={version}\n" for name, version in constraints.items()))
    command = ["--dry-run", "--ignore-installed", "--report", str(report), "-c", str(pins), "-e", f".[{extras}]", TORCH]
    subprocess.run([sys.executable, "-m", "pip", "install", *command], cwd=PROJECT, check=True)
    found = (item["metadata"] for item in json.loads(report.read_text())["install"])
    return {m["name"]: m["version"] for m in found if canonical(m["name"]) != "meml-grpo-harness"}


def lines(pins: dict[str, str]) -> str:
    return "".join(f"{name}=={pins[name]}\n" for name in sorted(pins, key=canonical))


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = {n: v for n, v in read_pins(PROJECT / "requirements.lock").items() if canonical(n) not in DROPPED}
        gpu = resolve("dev,gpu", base, Path(tmp))
        cluster = resolve("dev,cluster", {n: v for n, v in gpu.items() if canonical(n) != "numpy"}, Path(tmp))
    known = {canonical(name) for name in gpu}
    extra = {n: v for n, v in cluster.items() if canonical(n) not in known}
    LOCK.write_text(HEADER + lines(gpu) + CLUSTER + lines(extra))
    print(f"wrote {LOCK.name}: {len(gpu)} pins, {len(extra)} more for the cluster extra")


if __name__ == "__main__":
    main()
