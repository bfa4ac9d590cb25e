# MEML-GRPO reproduction DAG. `snakemake --cores N` runs the embedded default (toy world, CPU);
# `--configfile config/paper.yaml` the paper's grid. Rules live in pipeline/rules/, one file a stage:
#   tracking, data -> experts -> models -> sft -> rl -> eval -> analysis -> report
import hashlib
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path

from snakemake.utils import min_version, validate

min_version("9.0")

# The default config is read from the workflow's own folder, so `--directory` does not break it.
configfile: Path(workflow.basedir) / "config" / "default.yaml"
validate(config, Path(workflow.basedir) / "config" / "schema.yaml")

sys.path.insert(0, str(Path(workflow.basedir) / "pipeline"))
from meml.plan import grid  # noqa: E402
from meml.data.experts import prompts_of  # noqa: E402
from meml.core.io import DataError  # noqa: E402

try:
    N_EXPERTS = len(prompts_of(config))
    grid.check(config, N_EXPERTS)
except DataError as err:
    raise ValueError(f"invalid config: {err}") from None

PROFILE = config["profile"]
WORLD = config["world"]
RESULTS = f"results/{PROFILE}"
REPORT = f"report/{PROFILE}"
LOGS = f"logs/{PROFILE}"
DATASETS = config["grid"]["datasets"]
MODELS = grid.models(config)
CELLS = grid.cells(config)  # the grid's, then the extras' (extras.methods)
ALL_EXPERTS = list(range(N_EXPERTS))
PAPER_EXPERTS = list(grid.PAPER_EXPERTS)  # the paper's MEF experts; 3 and 4 exist for the number-of-experts study
CAPTIONS = Path(workflow.basedir) / "pipeline" / "report"

# Say what the grid will cost before anything runs (also on -n); not again inside each job.
if config["device"] == "cuda" and workflow.is_main_process:
    from meml.training import cost  # noqa: E402

    _speeds = cost.throughputs(config, Path(RESULTS) / "cost_throughput.json")
    _rows = cost.estimate(config, _speeds)
    _stages = ", ".join(
        f"{stage} {sum(r['hours'] for r in _rows if r['stage'] == stage):.1f}"
        for stage in ("sft", "rl+eval", "complementarity")
    )
    print(
        f"Estimated GPU-hours of this grid: {sum(r['hours'] for r in _rows):.1f} ({_stages}); throughput: "
        f"{next(iter(_speeds.values())).source}. Per cell: `python -m meml.cli cost --config <this config>`; "
        "measured on this GPU: add --measure.",
        file=sys.stderr,
    )
# The CLI of the Python that runs Snakemake (the project venv), so jobs see the same packages.
# `meml.run` hands the job to the warm worker (pipeline/meml/worker.py: torch, transformers,
# lm-eval and MLflow imported once, each job a forked child), or runs it here when there is none.
from meml import worker  # noqa: E402

WORKER_SOCKET = worker.socket_path()
OFFLINE = {"HF_HUB_OFFLINE": "1"} if WORLD == "toy" else {}  # the toy world never touches the network
# The socket reaches the jobs through the environment (set in onstart), never through a shell
# line or params: those are part of what Snakemake compares to decide a rerun.
MEML = f"{shlex.quote(sys.executable)} -m meml.run"
# Jobs use `threads` CPU threads each.
ENV = "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} TOKENIZERS_PARALLELISM=false" + "".join(
    f" {k}={v}" for k, v in OFFLINE.items()
)
_WORKER = {}


# A line per finished cell (pipeline/meml/progress.py): jobs done of total, time left, accuracy.
PROGRESS_STATE = Path(RESULTS) / ".progress.json"
PROGRESS = f"{shlex.quote(sys.executable)} -m meml.progress"


onstart:
    Path(RESULTS).mkdir(parents=True, exist_ok=True)
    PROGRESS_STATE.write_text(json.dumps({"start": time.time(), "total": len(workflow.dag)}))
    _WORKER["process"] = worker.start(WORKER_SOCKET, {"TOKENIZERS_PARALLELISM": "false", **OFFLINE})
    if _WORKER["process"] is not None:
        os.environ["MEML_WORKER"] = str(WORKER_SOCKET)  # inherited by every local job


def stop_worker():
    process = _WORKER.pop("process", None)
    if process is not None:
        process.terminate()
        process.wait(timeout=30)
        WORKER_SOCKET.with_suffix(".log").unlink(missing_ok=True)


onerror:
    stop_worker()
    for failure in calibration_failures():
        print(failure, file=sys.stderr)
GPU = 1 if config["device"] == "cuda" else 0
PROCESSES = config["launch"]["processes"]  # > 1: SFT and RL jobs run data-parallel (accelerate)


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


wildcard_constraints:
    model="|".join(re.escape(m) for m in config["models"]),
    ds="gsm8k|strategyqa|mathqa",
    method="|".join(re.escape(m) for m in config["methods"]),
    variant=r"e\d+(-e\d+)*",
    seed=r"\d+",


def cli_config(*sections, only=None):
    """The config sections a job reads, as one shell-quoted JSON for `--config-json`. Rules keep it
    in `params`, so Snakemake reruns a job exactly when a value it reads changes. `only` narrows a
    mapping section to the job's own entries ({"methods": ["MEML-GRPO"]}, {"teachers": ["e1"]}),
    so editing one method or one teacher reruns only its jobs."""
    chosen = {key: config[key] for key in sections}
    for section, keys in (only or {}).items():
        chosen[section] = {k: config[section][k] for k in keys if k in config[section]}
    if "methods" in (only or {}):  # where a method is shown (`tables`) never reruns its own jobs
        chosen["methods"] = {name: grid.switches(config, name) for name in chosen["methods"]}
    return shlex.quote(json.dumps(chosen))


include: "pipeline/rules/tracking.smk"
include: "pipeline/rules/data.smk"
include: "pipeline/rules/experts.smk"
include: "pipeline/rules/models.smk"
include: "pipeline/rules/sft.smk"
include: "pipeline/rules/calibration.smk"
include: "pipeline/rules/rl.smk"
include: "pipeline/rules/eval.smk"
include: "pipeline/rules/analysis.smk"
include: "pipeline/rules/report.smk"


onsuccess:
    stop_worker()
    from meml.reporting.finish import message  # noqa: E402

    print(message(config), file=sys.stderr)


rule all:
    input:
        rules.report.output,
        [f"{REPORT}/toy_stats.md"] if WORLD == "toy" else [],
