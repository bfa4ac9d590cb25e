"""GPU-hours of every cell of the grid, known before it runs.

Work, counted from the config (tokens are the unit):
    SFT, per (model, data set, SFT variant): train questions x experts x epochs x sft_tokens
    RL, per cell: steps x Q x rollouts per question (G shared, or G per expert)
        generated = rollouts x completion tokens (fill x rl.max_new_tokens)
        trained   = rollouts x (prompt + completion tokens) x updates_per_batch, plus a third of that
                    for the reference forward (beta > 0) and a quarter for IML's extra passes
                    (at most one pair of passes a question: 2 / G of the rollouts at G = 8)
        dynamic sampling counts its largest number of rounds (an upper bound)
    evaluation, per cell: test questions x evaluated experts x completion tokens (greedy), at
                    eval.backend's engine
    complementarity, per (model, data set): questions x 3 experts x samples x completion tokens,
                    at the engine the job samples with on its device (training/engines.py,
                    sampling_job_engine: vLLM on a GPU under rl.engine vllm; calibration too)
    teachers (API time, not GPU-hours), per teacher: training questions x tries (1 / acceptance)
                    x fill x max_tokens, at a request's tokens per second, `concurrency` at once
Time = generated / generation tokens per second + trained / training tokens per second, with the
throughputs measured on this machine by a few RL steps on a random-weight model of the same
architecture (`meml cost --measure`: training/probe.py's measure_throughput, saved by
save_measured), or the assumed H100 figures below.
This module imports no torch: the Snakefile prints the estimate on every (dry) run.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from meml.core.io import DataError, atomic_write_json

# Train / test questions of the real data sets as our loaders split them (README, data sets).
REAL_SIZES = {"gsm8k": (7473, 1319), "strategyqa": (1602, 687), "mathqa": (29837, 2985)}


@dataclass(frozen=True)
class Assumptions:
    prompt_tokens: int = 200  # a question with its system prompt
    fill: float = 0.6  # completions use this share of max_new_tokens on average
    sft_tokens: int = 900  # one teacher trajectory with its prompt (R1-style chains are long)
    teacher_acceptance: float = 0.7  # the share of a teacher's replies the checker accepts
    teacher_tokens_per_second: float = 30.0  # one API request's generation speed (a reasoning model)


@dataclass(frozen=True)
class Throughput:
    """Tokens per second on one GPU (or this machine): sampling, training (forward + backward)."""

    source: str
    generate: float
    train: float
    notes: list[str] = field(default_factory=list)


def assumed_h100(model_source: str, engine: str) -> Throughput:
    """Assumed one-H100 (80 GB, bf16) throughputs; every number is a stated guess, not a measurement.

    training: 8 N FLOPs a token (forward, backward, and the recomputation of gradient
    checkpointing) at 40% of the H100's 989 dense bf16 TFLOP/s -> 1.5B: 32k tokens/s, 1.2B: 40k.
    sampling: HF generate with batches of 256, 1024 new tokens: about 4k tokens/s (no paged
    attention, padded batches); vLLM: about 25k tokens/s for a model this size."""
    params = {"Qwen/Qwen2.5-Math-1.5B": 1.54e9, "meta-llama/Llama-3.2-1B-Instruct": 1.24e9}.get(model_source, 1.5e9)
    train = 0.4 * 989e12 / (8 * params)
    generate = 25_000.0 if engine == "vllm" else 4_000.0
    return Throughput(f"assumed H100 ({engine} engine)", generate, train, [assumed_h100.__doc__ or ""])


def sizes(cfg: dict[str, Any], ds: str) -> tuple[int, int]:
    if cfg["world"] == "toy":
        train, test = cfg["toy"]["sizes"][ds]
        return int(train), int(test)
    return REAL_SIZES[ds]


def rl_work(cfg: dict[str, Any], method: str, a: Assumptions, dataset: str | None = None) -> tuple[float, float]:
    """(generated tokens, trained tokens) of one RL cell (on `dataset`: its rl_by_dataset settings,
    and rl.epochs counted on its training size)."""
    from meml.core.config import method_rl

    s, sw = method_rl(cfg, method, dataset), cfg["methods"][method]
    experts = len(sw["rl_experts"])
    per_question = s["group_size"] * (experts if s["spread"] == "per_expert" else 1)
    steps = s["steps"]
    if s.get("epochs") is not None and dataset is not None:
        steps = math.ceil(float(s["epochs"]) * sizes(cfg, dataset)[0] / s["questions_per_step"])
    rollouts = steps * s["questions_per_step"] * per_question
    completion = a.fill * s["max_new_tokens"]
    generated = rollouts * completion * (1 + int(sw.get("dynamic_sampling") or 0))
    passes = s["updates_per_batch"] + (1 / 3 if s["updates_per_batch"] > 1 else 0)
    passes *= (1 + (1 / 3 if s["beta"] > 0 else 0)) * (1.25 if sw["iml"] else 1.0)
    trained = rollouts * (a.prompt_tokens + completion) * passes
    return generated, trained


def eval_tokens(cfg: dict[str, Any], ds: str, method: str, a: Assumptions) -> float:
    from meml.plan.grid import eval_experts, eval_max_new_tokens

    test = sizes(cfg, ds)[1] if cfg["eval"]["questions"] is None else min(cfg["eval"]["questions"], sizes(cfg, ds)[1])
    return test * len(eval_experts(cfg, method)) * a.fill * eval_max_new_tokens(cfg, ds)


def estimate(
    cfg: dict[str, Any], throughput: dict[str, Throughput], a: Assumptions | None = None
) -> list[dict[str, Any]]:
    """One row per job group: stage, model, data set, method, hours. `throughput` per grid model."""
    from meml.plan.grid import cells, complementarity_models, sft_variant

    a = a or Assumptions()
    rows: list[dict[str, Any]] = []
    for cell in cells(cfg):
        rl_hours, eval_hours = cell_hours(cfg, cell, throughput[cell.model], a)
        rows.append(
            {
                "stage": "rl+eval",
                "model": cell.model,
                "dataset": cell.dataset,
                "method": cell.method,
                "seed": cell.seed,
                "hours": rl_hours + eval_hours,
            }
        )
    variants: dict[tuple[str, str, str], int] = {}
    for cell in cells(cfg):
        experts = cfg["methods"][cell.method]["sft_experts"]
        variants[(cell.model, cell.dataset, sft_variant(experts))] = len(experts)
    for (model, ds, variant), n_experts in sorted(variants.items()):
        tokens = sizes(cfg, ds)[0] * n_experts * cfg["sft"]["epochs"] * a.sft_tokens
        rows.append({"stage": "sft", "model": model, "dataset": ds, "method": variant, "seed": None,
                     "hours": tokens / throughput[model].train / 3600})  # fmt: skip
    settings = cfg["analysis"]["complementarity"]
    for model in complementarity_models(cfg):
        rate = complementarity_rate(cfg, model, throughput[model])
        for ds in cfg["grid"]["datasets"]:
            questions = settings["questions"] or sizes(cfg, ds)[1]
            tokens = questions * 3 * settings["samples"] * a.fill * cfg["rl"]["max_new_tokens"]
            rows.append({"stage": "complementarity", "model": model, "dataset": ds, "method": "-", "seed": None,
                         "hours": tokens / rate / 3600})  # fmt: skip
    return rows


def cell_hours(cfg: dict[str, Any], cell: Any, t: Throughput, a: Assumptions) -> tuple[float, float]:
    """(RL hours, evaluation hours) of one cell: RL's sampling at rl.engine's rate, evaluation's at
    eval.backend's."""
    generated, trained = rl_work(cfg, cell.method, a, cell.dataset)
    evaluated = eval_tokens(cfg, cell.dataset, cell.method, a)
    evaluate = sampling_rate(cfg, cell.model, t, stage_engines(cfg)["evaluation"])
    return (generated / t.generate + trained / t.train) / 3600, evaluated / evaluate / 3600


# What a job spends besides its tokens: loading the model, starting vLLM, writing checkpoints.
JOB_OVERHEAD_MINUTES = 10


def slurm_runtimes(
    cfg: dict[str, Any], throughput: dict[str, Throughput], margin: float = 2.0, a: Assumptions | None = None
) -> dict[str, int]:
    """Minutes to ask SLURM for, per GPU rule: the longest job of the rule in this estimate, times
    `margin`, plus JOB_OVERHEAD_MINUTES, rounded up to half hours. profiles/slurm's runtimes are these
    for config/paper.yaml at the assumed H100 throughputs (a test holds them); a job that still runs out
    of time is requeued by its retries and resumes (RL and SFT from checkpoints, complementarity from
    its chunks)."""
    from meml.data.experts import prompts_of
    from meml.plan.grid import cells, eval_max_new_tokens

    a = a or Assumptions()
    rows = estimate(cfg, throughput, a)
    longest: dict[str, float] = {}

    def longer(rule: str, hours: float) -> None:
        longest[rule] = max(longest.get(rule, 0.0), hours)

    for cell in cells(cfg):
        rl_hours, eval_hours = cell_hours(cfg, cell, throughput[cell.model], a)
        longer("rl", rl_hours)
        longer("evaluate", eval_hours)
    for r in rows:
        if r["stage"] in ("sft", "complementarity"):
            longer(r["stage"], r["hours"])
    c = cfg["calibration"]
    experts = len(prompts_of(cfg))
    for model in dict.fromkeys(cell.model for cell in cells(cfg)):
        t = throughput[model]
        for ds in cfg["grid"]["datasets"]:
            test = sizes(cfg, ds)[1] if cfg["eval"]["questions"] is None else cfg["eval"]["questions"]
            evaluate = sampling_rate(cfg, model, t, stage_engines(cfg)["evaluation"])
            longer("evaluate_base", test * experts * a.fill * eval_max_new_tokens(cfg, ds) / evaluate / 3600)
            sampled = c["train_questions"] * c["samples"] * experts + (c["test_questions"] or sizes(cfg, ds)[1])
            rate = sampling_rate(cfg, model, t, stage_engines(cfg)["calibration"])
            longer("calibrate", sampled * a.fill * cfg["rl"]["max_new_tokens"] / rate / 3600)
    # the rules a config turns on beyond the paper's grid: an SFT model evaluated under every prompt
    # (eval.sft) as the base model is; a trl-trained cell evaluated as the cell is; trl's training of
    # a cell (trl.methods) at our loop's time, its GPU throughput being unmeasured (a retry starts it over)
    longest["evaluate_sft"] = longest.get("evaluate_base", 0.0)
    longest["evaluate_trl"] = longest.get("evaluate", 0.0)
    longest["trl_grpo"] = longest.get("rl", 0.0)
    return {
        rule: int(30 * math.ceil((hours * 60 * margin + JOB_OVERHEAD_MINUTES) / 30))
        for rule, hours in sorted(longest.items())
    }


def stage_engines(cfg: dict[str, Any]) -> dict[str, str]:
    """The engine each sampling stage uses, as the jobs choose it: RL's rollouts rl.engine's,
    evaluation eval.backend's, calibration and complementarity the sampling jobs' engine on the
    config's device (training/engines.sampling_job_engine_name: vLLM on a GPU under rl.engine vllm)."""
    from meml.training.engines import sampling_job_engine_name

    jobs = sampling_job_engine_name(str(cfg["device"]), str(cfg["rl"]["engine"]))
    return {"rl": cfg["rl"]["engine"], "evaluation": cfg["eval"]["backend"], "calibration": jobs,
            "complementarity": jobs}  # fmt: skip


def sampling_rate(cfg: dict[str, Any], model: str, t: Throughput, engine: str) -> float:
    """Tokens per second sampled by `engine`: the throughput's own rate where it is that engine's (the
    assumed rates are rl.engine's, and `meml cost --measure` times rl.engine), else the assumed H100
    rate of `engine` (vLLM's, or transformers' generate for kv and hf alike)."""
    if _kind(engine) == _kind(str(cfg["rl"]["engine"])):
        return t.generate
    return assumed_h100(str(cfg["models"][model]["source"]), engine).generate


def _kind(engine: str) -> str:
    return "vllm" if engine == "vllm" else "generate"  # assumed_h100 prices kv, hf and hf-copy alike


def complementarity_rate(cfg: dict[str, Any], model: str, t: Throughput) -> float:
    """Complementarity's sampling rate: its engine on the config's device (stage_engines)."""
    return sampling_rate(cfg, model, t, stage_engines(cfg)["complementarity"])


def teacher_lines(cfg: dict[str, Any], a: Assumptions | None = None) -> list[str]:
    """Each paid teacher's questions, tokens and hours of API time at its concurrency: what the first
    jobs of a real run cost before any GPU works (assumptions in Assumptions)."""
    a = a or Assumptions()
    lines = []
    for name in sorted(cfg.get("teachers") or {}):
        t = cfg["teachers"][name]
        if t.get("backend") not in ("openai", "vllm") or t.get("standin"):
            continue
        questions = sum(sizes(cfg, ds)[0] for ds in cfg["grid"]["datasets"])
        tries = min(1 / a.teacher_acceptance, float(t.get("max_attempts") or 1))
        tokens = questions * tries * a.fill * int(t.get("max_tokens") or 0)
        hours = questions * tries * a.fill * int(t.get("max_tokens") or 0) / a.teacher_tokens_per_second
        hours /= 3600 * int(t.get("concurrency") or 1)
        lines.append(
            f"Teacher {name} ({t.get('model')}): {questions:,} training questions x {tries:.1f} tries, about "
            f"{tokens / 1e6:.0f}M tokens, about {hours:.0f} h of API time at concurrency {t.get('concurrency') or 1} "
            f"(assumed {a.teacher_acceptance:.0%} accepted, {a.teacher_tokens_per_second:.0f} tokens/s a request)"
        )
    return lines


def table(rows: list[dict[str, Any]], throughput: dict[str, Throughput]) -> str:
    """Markdown: the RL+evaluation hours of each (model, data set, method) summed over seeds, then
    SFT and complementarity, then totals per model and for the grid."""
    lines = ["| stage | model | data set | method | GPU-hours |", "| --- | --- | --- | --- | ---: |"]
    grouped: dict[tuple[str, str, str, str], float] = {}
    for r in rows:
        key = (r["stage"], r["model"], r["dataset"], r["method"])
        grouped[key] = grouped.get(key, 0.0) + r["hours"]
    for (stage, model, ds, method), hours in grouped.items():
        lines.append(f"| {stage} | {model} | {ds} | {method} | {hours:.3g} |")
    for model in dict.fromkeys(r["model"] for r in rows):
        total = sum(r["hours"] for r in rows if r["model"] == model)
        lines.append(f"| **total** | {model} | | | **{total:.3g}** |")
    lines.append(f"| **total** | grid | | | **{sum(r['hours'] for r in rows):.3g}** |")
    sources = "; ".join(
        f"{m}: {t.source}, {t.generate:,.0f} sampled and {t.train:,.0f} trained tokens/s" for m, t in throughput.items()
    )
    return "\n".join([*lines, "", f"Throughputs: {sources}."])


def save_measured(path: Path, throughput: dict[str, Throughput]) -> None:
    atomic_write_json(path, {m: asdict(t) for m, t in throughput.items()})


def load_measured(path: Path) -> dict[str, Throughput]:
    try:
        data = json.loads(path.read_text())
        return {m: Throughput(**t) for m, t in data.items()}
    except (OSError, ValueError, TypeError) as err:
        raise DataError(f"unreadable throughput file: {err}", path) from None


def throughputs(cfg: dict[str, Any], measured: Path | None = None) -> dict[str, Throughput]:
    """Measured throughputs when a file of them exists (for every grid model), else assumed H100."""
    from meml.plan.grid import models

    if measured is not None and measured.is_file():
        found = load_measured(measured)
        missing = [m for m in models(cfg) if m not in found]
        if not missing:
            return found
    engine = cfg["rl"]["engine"]
    return {m: assumed_h100(str(cfg["models"][m]["source"]), engine) for m in models(cfg)}


def report(cfg: dict[str, Any], measured: Path) -> str:
    """`meml cost`: the table of GPU-hours per cell, from the throughputs measured here (kept in
    `measured` by `meml cost --measure`: training/probe.py's measure_throughput), or assumed."""
    speeds = throughputs(cfg, measured)
    engines = ", ".join(f"{stage} {engine}" for stage, engine in stage_engines(cfg).items())
    engine_line = f"Sampling engines, as the jobs pick them: {engines}."
    return "\n".join([table(estimate(cfg, speeds), speeds), engine_line, terms(cfg, measured)])


def terms(cfg: dict[str, Any], measured: Path) -> str:
    """What the estimate counts and what it leaves out, said beside its figure: a renter reads the
    hours as a floor, and knows by how much the start-ups alone could raise it."""
    speeds = throughputs(cfg, measured)
    rows = estimate(cfg, speeds)
    # every cell is an RL job and an evaluation job; SFT and complementarity rows are a job each
    jobs = sum(2 if r["stage"] == "rl+eval" else 1 for r in rows)
    assumed = any(t.source.startswith("assumed") for t in speeds.values())
    rate = "training at 40% of the H100's dense bf16 peak, assumed sampling rates" if assumed else "measured rates"
    return (
        f"The estimate counts tokens only ({rate}; a completion {Assumptions().fill:.0%} of max_new_tokens). "
        "Not counted: the padding of the update's passes (each micro-batch runs every row at its longest "
        f"row's length), and each job's start-up (loading the model, starting vLLM, checkpoints): up to "
        f"{JOB_OVERHEAD_MINUTES} min x {jobs} GPU jobs = {jobs * JOB_OVERHEAD_MINUTES / 60:.0f} GPU-hours more."
    )


def headline(cfg: dict[str, Any], measured: Path) -> str:
    """One line with the grid's GPU-hours by stage: what the workflow says before anything runs."""
    speeds = throughputs(cfg, measured)
    rows = estimate(cfg, speeds)
    stages = ", ".join(
        f"{stage} {sum(r['hours'] for r in rows if r['stage'] == stage):.1f}"
        for stage in ("sft", "rl+eval", "complementarity")
    )
    engines = ", ".join(f"{stage} {engine}" for stage, engine in stage_engines(cfg).items())
    return (
        f"Estimated GPU-hours of this grid: {sum(r['hours'] for r in rows):.1f} ({stages}); throughput: "
        f"{next(iter(speeds.values())).source}; sampling engines: {engines}. Per cell: "
        "`python -m meml.cli cost --config <this config>`; measured on this GPU: add --measure."
    )


def headlines_both_engines(cfg: dict[str, Any], measured: Path) -> list[str]:
    """The headline with the config's rollout engine, then with the other of vllm and hf: what
    choosing the engine costs, said before the run."""
    engine = cfg["rl"]["engine"]
    other = "hf" if engine == "vllm" else "vllm"
    lines = [f"{headline(cfg, measured)} [rl.engine: {engine}, this config]"]
    alternative = {**cfg, "rl": {**cfg["rl"], "engine": other}}
    hours = sum(r["hours"] for r in estimate(alternative, throughputs(alternative, measured)))
    lines.append(f"With rl.engine: {other} instead: {hours:.1f} GPU-hours.")
    return [*teacher_lines(cfg), terms(cfg, measured), *lines]
