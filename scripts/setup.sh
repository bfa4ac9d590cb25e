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
echo "setup done: $(.venv/bin/python -c 'import torch, transformers, trl; print("torch", torch.__version__, "transformers", transformers.__version__, "trl", trl.__version__)')"
