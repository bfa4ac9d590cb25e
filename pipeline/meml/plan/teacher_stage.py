"""The teacher stage of a real run, before the GPUs: where it runs and how its results reach the node.

An API teacher's job (`teachers.e<k>.backend: openai`) waits on the network for hours (the dry run
prints each teacher's API time), and every SFT job waits on the teachers' trajectories: started on
a rented GPU node, it leaves the node's GPUs idle all that time. So the teachers run first on any
machine without a GPU, with the check of their lengths against RL's cap:

    make teachers CONFIG=config/paper.yaml                  # the `teachers` target (rules/experts.smk)
    make carry CONFIG=config/paper.yaml NODE=user@node:dir  # carry_command(): rsync to the node

and a local run that has GPUs (`--resources gpu=N`, or GPUs on the machine) refuses, before any
job, to start an API teacher's job unless OVERRIDE is set (refusal(), from the Snakefile's onstart).
Under SLURM each job is placed by the scheduler (a teacher on a CPU partition): nothing is refused.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from meml.plan.layout import Layout

OVERRIDE = "MEML_TEACHERS_ON_GPU_NODE"  # =1: run API teachers on a GPU node all the same


def api_teacher(cfg: dict[str, Any], expert: int | str) -> bool:
    """Whether expert k's teacher waits on a network API (backend openai; the local stand-in does not)."""
    t = (cfg.get("teachers") or {}).get(f"e{expert}") or {}
    return t.get("backend") == "openai" and not t.get("standin")


def refusal(
    cfg: dict[str, Any], jobs: Iterable[tuple[str, dict[str, str]]], gpus: int, configfiles: list[str]
) -> str | None:
    """The message that stops a local run on a machine with `gpus` GPUs before it starts an API
    teacher's job (jobs: the run's (rule, wildcards) to do; configfiles: the run's --configfile, for
    the commands it names); None when there is nothing to refuse or OVERRIDE is set."""
    if not gpus or os.environ.get(OVERRIDE) == "1":
        return None
    teachers = sorted(
        {(w["k"], w["ds"]) for rule, w in jobs if rule == "teacher_trajectories" and api_teacher(cfg, w["k"])}
    )
    if not teachers:
        return None
    names = ", ".join(f"teachers.e{k} on {ds}" for k, ds in teachers)
    configfile = shlex.quote(" ".join(configfiles)) if configfiles else "<your config>"
    return (
        f"this run would start {len(teachers)} teacher job(s) on a machine with {gpus} GPU(s): {names}.\n"
        "  A teacher job waits on its API for hours (the dry run prints each teacher's API time) and every SFT "
        "job waits on the teachers, so the GPUs would idle until they finish.\n"
        f"  Run them first on a machine without a GPU, `make teachers CONFIG={configfile}` (the `teachers` "
        f"target), then from there carry their results here, `make carry CONFIG={configfile} "
        "NODE=<this machine>:<this project's folder>` (docs/gpus-and-clusters.md, 'Renting a GPU node, in order').\n"
        f"  To run them on this machine all the same, set {OVERRIDE}=1."
    )


def check(workflow: Any, cfg: dict[str, Any], granted_gpus: int) -> None:
    """The Snakefile's onstart: refusal() for a local run, its GPUs those granted (`--resources
    gpu=N`) or else the machine's own (meml.core.gpus: CUDA_VISIBLE_DEVICES, nvidia-smi,
    MEML_SIMULATE_GPUS)."""
    if workflow.non_local_exec:
        return
    from meml.core.gpus import node_gpus

    jobs = [(job.rule.name, dict(job.wildcards_dict)) for job in workflow.dag.needrun_jobs()]
    if not any(rule == "teacher_trajectories" for rule, _ in jobs):
        return
    default = (Path(workflow.basedir) / "config" / "default.yaml").resolve()
    configfiles = [str(f) for f in workflow.configfiles if Path(f).resolve() != default]
    said = refusal(cfg, jobs, granted_gpus or len(node_gpus()), configfiles)
    if said:
        raise ValueError(said)


def carry_paths(cfg: dict[str, Any], root: str | Path = ".") -> list[str]:
    """What the teacher stage leaves that the GPU node needs, relative to the project folder, those
    that exist: the profile's results (data sets, trajectories, the teachers' cache, the length
    checks, any downloaded model), the MLflow store when it is a file here (the teachers' runs and
    the profile's experiment, which the results name), the profile's logs, and Snakemake's record of
    each output (.snakemake/metadata: the params and code it was made with), without which the node
    could not tell the carried outputs current."""
    paths = [str(Layout.of(cfg).root), f"logs/{cfg['profile']}", ".snakemake/metadata"]
    mlflow = cfg.get("mlflow") or {}
    uri = str(mlflow.get("tracking_uri") or "")
    if mlflow.get("enabled", True) and uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        paths.append(uri.removeprefix("sqlite:///"))  # a store relative to the project folder
        if mlflow.get("artifacts"):
            paths.append(str(mlflow["artifacts"]))
    return [p for p in paths if (Path(root) / p).exists()]


def carry_command(cfg: dict[str, Any], to: str, root: str | Path = ".") -> list[str]:
    """rsync of carry_paths() to `to` (host:folder, the project's folder on the node), each path kept
    relative to the project (-R) with its modification time (-a), which Snakemake compares."""
    return ["rsync", "-aR", "--info=stats1", *carry_paths(cfg, root), to.rstrip("/") + "/"]


def shell_line(command: list[str]) -> str:
    return " ".join(shlex.quote(part) for part in command)


def checks_before_sft(cfg: dict[str, Any], model: str, dataset: str) -> list[dict[str, Any]]:
    """What RL will check of this model's trajectories on this data set when each of its cells starts
    (training/lengths.py): per (rl.max_new_tokens, rl.max_truncated_share) of the cells' methods on
    the data set, the experts they sample from. The rule trajectory_lengths checks it before SFT."""
    from meml.core.config import method_rl
    from meml.plan import grid

    caps: dict[tuple[int, float], set[int]] = {}
    for cell in grid.cells(cfg):
        if (cell.model, cell.dataset) == (model, dataset):
            rl = method_rl(cfg, cell.method, dataset)
            key = (int(rl["max_new_tokens"]), float(rl["max_truncated_share"]))
            caps.setdefault(key, set()).update(int(k) for k in cfg["methods"][cell.method]["rl_experts"])
    return [
        {"experts": sorted(experts), "max_new_tokens": cap, "max_truncated_share": share}
        for (cap, share), experts in sorted(caps.items())
    ]
