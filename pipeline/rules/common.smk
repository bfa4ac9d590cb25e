# What every rule file shares: the checked config, the names of the result folders, how a job is
# started (the warm worker, or accelerate for data-parallel training), and the helpers the rules'
# inputs and params call. Rules spell their shell lines plainly: paths come in as params.
import hashlib
import json
import os
import re
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "pipeline"))
from meml import lifecycle  # noqa: E402
from meml.core.config import RUN_KEYS, in_schema_order, offline_env, run_settings, without_run_keys  # noqa: E402
from meml.data.experts import prompts_of  # noqa: E402
from meml.plan import checks, grid, teacher_stage  # noqa: E402
from meml.plan.layout import WILDCARD_CELL, Layout, report_dir  # noqa: E402

lifecycle.use_workflow_code(Path(workflow.basedir) / "pipeline")  # jobs import this folder's meml (see there)

# The config checked (its defaults filled in), a target naming what the config lacks refused, and a
# real or GPU run's needs, cost and refusals said: plan/checks.py, before anything else.
try:
    checks.at_parse(config, sys.argv[1:], main_process=workflow.is_main_process, dry_run=workflow.dryrun)
except ValueError as err:  # said once, without the frames of the checks
    raise ValueError(str(err)) from None
N_EXPERTS = len(prompts_of(config))

PROFILE = config["profile"]
WORLD = config["world"]
# Every result path is Layout's (pipeline/meml/plan/layout.py); with wildcards for names, its paths
# are the rules' patterns (W: {model}, {ds}, {method}, {seed}).
LAYOUT = Layout.of(config)
W = WILDCARD_CELL
REPORT = str(report_dir(config))
LOGS = f"logs/{PROFILE}"
DATASETS = config["grid"]["datasets"]
MODELS = grid.models(config)
CELLS = grid.cells(config)  # the grid's, then the extras' (extras.methods)
ALL_EXPERTS = list(range(N_EXPERTS))
PAPER_EXPERTS = list(grid.PAPER_EXPERTS)  # the paper's MEF experts; 3 and 4 exist for the number-of-experts study
CAPTIONS = Path(workflow.basedir) / "pipeline" / "report"
# GPUs a job takes: one, or launch.processes for SFT and RL. MEML_SIMULATE_GPUS=K runs the same
# placement on a CPU with K pretend GPUs (pipeline/meml/core/gpus.py; docs/gpus-and-clusters.md).
SIMULATED_GPUS = int(os.environ.get("MEML_SIMULATE_GPUS") or 0)
GPU = 1 if config["device"] == "cuda" or SIMULATED_GPUS else 0
PROCESSES = config["launch"]["processes"]  # > 1: SFT and RL jobs run data-parallel (accelerate)
# The node's GPUs as the command grants them (`--resources gpu=N`), for the CPU threads of GPU jobs.
_granted = workflow.global_resources.get("gpu")
NODE_GPUS = int(getattr(_granted, "value", _granted) or 0)


def gpu_threads(gpus):
    """CPU threads of a job that holds `gpus` GPUs: `threads`, but never more than those GPUs' share of
    the cores, so that every GPU can hold a job at once (`--cores 16 --resources gpu=8`: eight one-GPU
    jobs of 2 threads each, where `threads: 8` would let two run). `threads` without a GPU count: a CPU
    run, or SLURM, where each job is given the cores it asks for on a node of its own."""
    cores = workflow.resource_settings.cores
    if not gpus or not NODE_GPUS or not cores:
        return config["threads"]
    return max(1, min(config["threads"], cores * gpus // NODE_GPUS))


# The CLI of the Python that runs Snakemake (the project venv), so jobs see the same packages.
# `meml.run` hands the job to the warm worker (pipeline/meml/worker.py: torch, transformers,
# lm-eval and MLflow imported once, each job a forked child), or runs it here when there is none.
# The socket reaches the jobs through the environment (set in onstart), never through a shell
# line or params: those are part of what Snakemake compares to decide a rerun.
MEML = f"{shlex.quote(sys.executable)} -m meml.run"
# A job that takes GPUs starts through meml.core.gpus, which gives it GPUs of its own (CUDA_VISIBLE_DEVICES):
# Snakemake's --resources gpu=K only counts. Empty without GPUs, so a CPU job's command is unchanged.
ON_GPU = f"{shlex.quote(sys.executable)} -m meml.core.gpus {GPU}" if GPU else ""
ON_GPUS = f"{shlex.quote(sys.executable)} -m meml.core.gpus {GPU * PROCESSES}" if GPU else ""
OFFLINE = offline_env(config)
# A line per finished cell (pipeline/meml/progress.py): jobs done of total, time left, accuracy.
PROGRESS = f"{shlex.quote(sys.executable)} -m meml.progress"
PROGRESS_STATE = lifecycle.progress_file(config)


# The environment a compute job starts with, `threads` CPU threads each, at the head of its shell line:
# Snakemake formats {threads} into the line and compares only the line's template, so the thread count
# (a run key, core/config.RUN_KEYS) reruns nothing.
JOB_ENV = " ".join(
    ["OMP_NUM_THREADS={threads}", "MKL_NUM_THREADS={threads}", "TOKENIZERS_PARALLELISM=false", *(f"{k}={v}" for k, v in OFFLINE.items())]
) + " "


def launcher(job):
    """How a training job starts: the CLI, or `accelerate launch` with PROCESSES processes (one a
    GPU) and a rendezvous port of its own, so that jobs running side by side do not collide."""
    if PROCESSES == 1:
        return MEML
    port = 29500 + int(hashlib.sha256(job.encode()).hexdigest(), 16) % 5000
    accelerate_config = Path(workflow.basedir) / config["launch"]["accelerate_config"]
    return (
        f"{shlex.quote(sys.executable)} -m accelerate.commands.launch --config_file {shlex.quote(str(accelerate_config))} "
        f"--num_processes {PROCESSES} --main_process_port {port} -m meml.cli"
    )


def cli_config(*sections, only=None, shown=False, replicates=None, dataset=None):
    """The config sections a job reads, as one shell-quoted JSON for `--config-json`. Rules keep it
    in `params`, so Snakemake reruns a job exactly when a value it reads changes. `only` narrows a
    mapping section to the job's own entries ({"methods": ["MEML-GRPO"]}, {"teachers": ["e1"]}),
    so editing one method or one teacher reruns only its jobs. A model's published figures and
    `eval.base` and `eval.sft` concern the report only (`shown`): editing them reruns no training or
    evaluation (turning one on adds its evaluations, nothing else). How a job runs, not what it
    computes (core/config.RUN_KEYS), is left out: RUN_SETTINGS carries it, so every rule that passes a
    section holding a run key puts {RUN_SETTINGS} on its shell line. A job of one data set (`dataset`)
    gets that data set's `rl_by_dataset` entry alone: editing another's reruns nothing of it."""
    chosen = {key: config[key] for key in sections}
    if "rl_by_dataset" in chosen and dataset is not None:
        chosen["rl_by_dataset"] = {k: v for k, v in chosen["rl_by_dataset"].items() if k == dataset}
    for section, keys in (only or {}).items():
        chosen[section] = {k: config[section][k] for k in keys if k in config[section]}
    if "methods" in (only or {}):  # where a method is shown (`tables`) never reruns its own jobs
        chosen["methods"] = {name: grid.switches(config, name) for name in chosen["methods"]}
    if "models" in chosen and not shown:
        chosen["models"] = {name: grid.model_values(entry) for name, entry in chosen["models"].items()}
    if "eval" in chosen and not shown:  # which extra models are evaluated concerns the report and the DAG
        chosen["eval"] = {k: v for k, v in chosen["eval"].items() if k not in ("base", "sft")}
    if replicates is not None:  # the report's: the replicates on disk (REPLICATES)
        chosen["report"] = {**chosen["report"], "replicates": replicates}
    chosen = {k: without_run_keys(k, v) if isinstance(v, dict) else v for k, v in chosen.items() if k not in RUN_KEYS}
    # in the schema's order (named entries, the order of models and methods, in the tables' order): a
    # config file that names a run key inside a section (rl.vllm) must not reorder what Snakemake compares
    return shlex.quote(json.dumps({k: in_schema_order(k, v) for k, v in chosen.items()}))


# How a job runs, not what it computes (core/config.RUN_KEYS: checkpoints, memory, batch sizes of no
# result, threads, where MLflow is), as `--run` options on the jobs' shell lines: Snakemake compares a
# rule's params and its shell line's template, never the values formatted into it, so changing one of
# these reruns nothing. `--run` sets a teacher's keys only in a job that reads that teacher's entry.
RUN_SETTINGS = " ".join(f"--run {shlex.quote(f'{k}={json.dumps(v)}')}" for k, v in run_settings(config).items())


# What a seed retrains, for the jobs that must know it (SFT, RL, a seed's own base model); passed
# only where seeds retrain more than RL, so that a run of the default config keeps its jobs' params.
# Not grid.seeds: adding a seed must run that seed's jobs only.
SEEDS_VARY = {"grid": ["seeds_vary"]} if grid.varies(config, "sft") else {}


def sft_variant(wildcards):
    """The SFT run a cell starts RL from: its method's sft_experts (e0-e1-e2), and its seed where
    seeds retrain SFT (e0-e1-e2/seed3; grid.seeds_vary)."""
    return grid.sft_run(config, config["methods"][wildcards.method]["sft_experts"], int(wildcards.seed))


def seed_world(seed):
    """The world folder grid seed `seed` trains on: its own where seeds redraw the data
    (results/<profile>/toy/seed3; grid.seeds_vary: data), else the shared one."""
    sub = grid.data_folder(config, None if seed in (None, "") else int(seed))
    return str(LAYOUT.world(WORLD, sub))


def test_data(seed):
    """The data sets whose test questions grid seed `seed`'s models are evaluated on: the seed's own
    where each seed draws a world of its own (grid.seeds_vary: world), else the shared world's."""
    sub = grid.test_folder(config, None if seed in (None, "") else int(seed))
    return str(LAYOUT.data_root(WORLD, sub))


def test_file(seed, ds):
    return f"{test_data(seed)}/{ds}/test.jsonl"


FIRST_SEED = config["grid"]["seeds"][0]  # the seed of the shared analyses (base model, complementarity)


def seed_world_files(seed):
    """What a seed's own world is made of, as inputs (its data sets' splits and trajectories)."""
    world = seed_world(seed)
    if world == str(LAYOUT.world(WORLD)):
        return []
    return [
        *expand(f"{world}/data/{{ds}}/{{split}}.jsonl", ds=DATASETS, split=["train", "test"]),
        *expand(f"{world}/experts/{{ds}}/e{{k}}.jsonl", ds=DATASETS, k=ALL_EXPERTS),
    ]


def variant_experts(wildcards):
    """An SFT run's experts as the CLI takes them: e0-e1-e2 (or e0-e1-e2/seed3) -> 0,1,2."""
    return ",".join(str(k) for k in grid.run_experts(wildcards.variant))


def variant_seed(wildcards):
    """`--seed k` for a seed's own SFT run (e0-e1-e2/seed3), nothing for a shared one."""
    seed = grid.run_seed(wildcards.variant)
    return "" if seed is None else f"--seed {seed}"


def rl_run_dir(wildcards):
    """A cell's RL run folder, quoted for the shell."""
    w = wildcards
    return shlex.quote(str(LAYOUT.rl(grid.Cell(w.model, w.ds, w.method, w.seed))))


def base_model_files(wildcards):
    """The built model's files (tiny, or converted from a GGUF file; an SFT run's seed's own where
    seeds retrain pretraining), or nothing for a hub id."""
    variant = getattr(wildcards, "variant", None)
    folder = grid.base_folder(config, wildcards.model, grid.run_seed(variant) if variant else None)
    return [str(LAYOUT.models / folder / "config.json")] if folder else []


def byo_file(wildcards):
    """A bring-your-own teacher's file (backend jsonl), so that editing it reruns its expert."""
    teacher = config["teachers"].get(f"e{wildcards.k}", {})
    return [f"{teacher['path']}/{wildcards.ds}/e{wildcards.k}.jsonl"] if teacher.get("backend") == "jsonl" else []


def project_file(path):
    """A file named relative to the working folder, else to the workflow (the defaults are)."""
    return path if Path(path).is_absolute() or Path(path).is_file() else str(Path(workflow.basedir) / path)


wildcard_constraints:
    model="|".join(re.escape(m) for m in config["models"]),
    ds="gsm8k|strategyqa|mathqa",
    method="|".join(re.escape(m) for m in config["methods"]),
    variant=r"e\d+(-e\d+)*(/seed\d+)?",
    seed=r"\d+",
