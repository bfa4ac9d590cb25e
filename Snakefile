# MEML-GRPO reproduction DAG. `snakemake --cores N` runs the embedded default (toy world, CPU);
# `--configfile config/paper.yaml` the paper's grid. Rules live in pipeline/rules/, one file a stage
# (common.smk: what they share):
#   tracking, data -> experts -> models -> sft -> calibration -> rl -> eval -> analysis -> report
import collections
from pathlib import Path

from snakemake.utils import min_version

min_version("9.0")


# The default config is read from the workflow's own folder, so `--directory` does not break it.
configfile: Path(workflow.basedir) / "config" / "default.yaml"


include: "pipeline/rules/common.smk"
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


# The warm worker lives as long as the workflow (pipeline/meml/worker.py).
from meml import worker  # noqa: E402

WORKER_SOCKET = worker.socket_path()
_WORKER = {}


onstart:
    Path(RESULTS).mkdir(parents=True, exist_ok=True)
    # `all` has no output, so no job record: it is never counted as done, nor as left
    rules = collections.Counter(job.rule.name for job in workflow.dag.needrun_jobs() if job.rule.name != "all")
    PROGRESS_STATE.write_text(json.dumps({"start": time.time(), "total": len(workflow.dag), "rules": rules}))
    # Not on a cluster (--executor slurm): jobs run on other nodes, which cannot reach this
    # machine's socket, and on this one the worker would run them outside the scheduler's control.
    # They start as fresh processes there (`meml.run` falls back when MEML_WORKER is unset).
    if workflow.non_local_exec:
        os.environ.pop("MEML_WORKER", None)
        from meml.cluster import patch_slurm_plugin  # a cancelled job must end the run (see there)

        patch_slurm_plugin()
        return
    if GPU:  # each job that takes GPUs records which it got (pipeline/meml/core/gpus.py)
        os.environ["MEML_GPU_LOG"] = str(Path(LOGS).resolve() / "gpus.jsonl")
        Path(LOGS).mkdir(parents=True, exist_ok=True)
    env = {"TOKENIZERS_PARALLELISM": "false", **OFFLINE}
    _WORKER["process"] = worker.start(WORKER_SOCKET, env, device=config["device"])
    if _WORKER["process"] is not None:
        os.environ["MEML_WORKER"] = str(WORKER_SOCKET)  # inherited by every local job


def stop_worker():
    process = _WORKER.pop("process", None)
    if process is not None:
        process.terminate()
        process.wait(timeout=30)
        WORKER_SOCKET.with_suffix(".log").unlink(missing_ok=True)


onsuccess:
    stop_worker()
    from meml.reporting import run_record  # noqa: E402
    from meml.reporting.finish import message  # noqa: E402

    if not workflow.dryrun:  # the run's own facts: report/<profile>/run.json
        run_record.write(config, PROGRESS_STATE, Path(REPORT), workflow.cores)

    print(message(config), file=sys.stderr)


onerror:
    stop_worker()
    from meml.reporting import run_record  # noqa: E402

    if not workflow.dryrun:  # a part that failed or was stopped still cost what it cost
        run_record.write(config, PROGRESS_STATE, Path(REPORT), workflow.cores)
    for failure in calibration_failures():
        print(failure, file=sys.stderr)


rule all:
    input:
        rules.report.output,
        [f"{REPORT}/toy_stats.md"] if WORLD == "toy" else [],
    default_target: True
