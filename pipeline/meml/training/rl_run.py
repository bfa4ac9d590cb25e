"""An RL run's life around its steps: load (models, optimisers, data, checks), start (the run folder),
resume (the newest checkpoint that verifies), checkpoint, finish (the final model and DONE).

Everything that can fail is loaded and checked before an old run in the folder is touched; a run
whose cell values changed, or whose DONE was removed (`snakemake --forcerun`), is moved into
<run>/previous/<time>/ (nothing is deleted) and its MLflow run retagged.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from meml.core.attention import attention_kwargs
from meml.core.io import DataError, atomic_write_json
from meml.core.precision import Precision
from meml.core.records import Record, read_records
from meml.core.stops import stop_tokens
from meml.core.tracking import Tracker, read_metrics
from meml.data.experts import read_trajectories
from meml.training import checkpoint
from meml.training.buffer import HardExampleBuffer
from meml.training.distributed import Dist
from meml.training.engines import make_engine
from meml.training.groups import QuestionOrder
from meml.training.lengths import check_fits, over_cap_shares
from meml.training.rl_settings import RLSettings
from meml.training.rl_step import Learner
from meml.training.rollout import RolloutEngine

RUN_FILES = ("checkpoints", "model", "metrics.jsonl", "DONE", "mlflow_run_id", "cell.json")


@dataclass
class Loaded:
    """What a run holds across its steps."""

    learner: Learner
    engine: RolloutEngine
    tokenizer: Any
    records: list[Record]
    by_id: dict[str, Record]
    over_cap: dict[str, float]  # the share of each RL expert's SFT trajectories over max_new_tokens
    solution: Any  # hard example -> the text HSFT learns
    buf: HardExampleBuffer
    order: QuestionOrder
    stops: Any  # stops.end_of_turn ends a turn
    steps: int  # the RL budget: rl.steps, or rl.epochs passes over the training questions


def load(
    s: RLSettings,
    experts: list[int],
    model_dir: str | Path,
    data_dir: str | Path,
    experts_dir: str | Path,
    seed: int,
    precision: Precision,
    dist: Dist,
    engine: RolloutEngine | None,
) -> Loaded:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # fp32 master weights in every precision; bf16 runs compute under autocast (precision.py)
    policy: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **attention_kwargs(dist.device))
    policy.to(torch.device(dist.device))
    if precision.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
    policy.train()
    reference: Any = None
    if s.beta > 0:
        reference = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=precision.torch_dtype(), **attention_kwargs(dist.device)
        )
        reference.to(torch.device(dist.device)).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=s.lr, weight_decay=0.0)
    sft_optimizer = torch.optim.AdamW(policy.parameters(), lr=s.buffer.sft_lr, weight_decay=0.0)
    warmup = max(1, s.warmup_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / warmup))
    engine = engine or make_engine(s.engine, policy, model_dir, tokenizer, s, precision, seed, dist.rank)
    records = read_records(Path(data_dir) / "train.jsonl")
    by_id = {r.id: r for r in records}
    over_cap = over_cap_shares(tokenizer, experts_dir, experts, by_id, s.max_new_tokens)
    check_fits(over_cap, s.max_new_tokens, s.max_truncated_share, experts_dir)
    return Loaded(
        Learner(policy, reference, optimizer, sft_optimizer, scheduler, precision, tokenizer.pad_token_id),
        engine,
        tokenizer,
        records,
        by_id,
        over_cap,
        hsft_solutions(s.buffer.solution, records, experts_dir),
        HardExampleBuffer(s.buffer.capacity, s.buffer.threshold, s.buffer.insert_prob, seed),
        QuestionOrder(len(records), seed),  # the same order in every process
        stop_tokens(tokenizer),
        s.steps if s.epochs is None else math.ceil(s.epochs * len(records) / s.questions_per_step),
    )


def start(
    out: Path, params: dict[str, Any] | None, steps: int, mlflow_settings: dict[str, Any] | None, dist: Dist
) -> None:
    """The folder is this run's: an old run of other values, or a finished one forced to rerun,
    moves aside first. Only now is the folder touched."""
    if dist.is_main:
        newest = checkpoint.newest_marked(out / "checkpoints")  # no checksum needed to read its step
        if not same_params(out, params):
            move_aside(out, "the cell's values changed", mlflow_settings)
        elif not (out / "DONE").is_file() and (
            (newest is not None and checkpoint.step_of(newest) >= steps) or (out / "model").exists()
        ):
            # a finished run whose DONE was removed (snakemake --forcerun): train it again (its final
            # model tells it apart where rl.keep_checkpoints: false removed its last checkpoint)
            move_aside(out, "its DONE marker was removed (a forced rerun)", mlflow_settings)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / "cell.json", params or {})
    dist.barrier()


def resume(run: Loaded, out: Path, seed: int, dist: Dist) -> int:
    """Continue from the newest checkpoint that verifies; the step to start at (0: a new run)."""
    last = checkpoint.latest(out / "checkpoints")
    if last is None:
        if dist.rank > 0:
            torch.manual_seed(seed + 7919 * dist.rank)  # each process samples its own rollouts
        return 0
    state = checkpoint.load(last)
    learner = run.learner
    learner.policy.load_state_dict(state["model"])
    learner.optimizer.load_state_dict(state["optimizer"])
    learner.scheduler.load_state_dict(state["scheduler"])
    run.order.load_state_dict(state["order"])
    run.buf.load_state_dict(state["buffer"])
    learner.sft_optimizer.load_state_dict(state["sft_optimizer"])
    rngs = state["rng"] if isinstance(state["rng"], list) else [state["rng"]]
    if len(rngs) != dist.world:
        raise DataError(f"checkpoint of {len(rngs)} process(es) cannot resume in {dist.world}", last)
    checkpoint.set_rng_state(rngs[dist.rank])
    return int(state["step"])


def save(run: Loaded, out: Path, done_steps: int, dist: Dist, tracker: Tracker | None) -> None:
    """A checkpoint (the main process writes it); then these steps' metrics reach MLflow."""
    rngs = dist.gather(checkpoint.rng_state())
    if dist.is_main:
        learner = run.learner
        checkpoint.save(
            out / "checkpoints",
            done_steps,
            {
                "step": done_steps,
                "model": learner.policy.state_dict(),
                "optimizer": learner.optimizer.state_dict(),
                "sft_optimizer": learner.sft_optimizer.state_dict(),
                "scheduler": learner.scheduler.state_dict(),
                "order": run.order.state_dict(),
                "buffer": run.buf.state_dict(),
                "rng": rngs,  # one state per process
            },
        )
        assert tracker is not None
        tracker.commit()
    dist.barrier()


def finish(
    run: Loaded,
    out: Path,
    method: str,
    precision: Precision,
    dist: Dist,
    tracker: Tracker | None,
    environment: dict[str, Any],
    keep_checkpoints: bool = True,
) -> dict[str, Any]:
    """The final model and the run's summary in DONE, written last; then, with keep_checkpoints
    false, the checkpoints go (removed after DONE: a crash in between leaves them, harmlessly)."""
    if dist.is_main:
        from meml.data.tiny_models import save_atomically

        assert tracker is not None
        save_atomically(out / "model", run.tokenizer, run.learner.policy)
        lines = read_metrics(out / "metrics.jsonl")
        summary = {
            "method": method,
            "steps": run.steps,
            "processes": dist.world,
            "precision": precision.dtype,
            "trajectories_over_max_new_tokens": run.over_cap,
            "final": lines[-1] if lines else {},
            "reward_first": lines[0]["reward/mean"] if lines else None,
            "reward_last": lines[-1]["reward/mean"] if lines else None,
            "mlflow_run_id": tracker.run_id,
            "environment": environment,
        }
        tracker.log_artifact(out / "metrics.jsonl")
        tracker.log_artifact(out / "cell.json")  # the values that define the cell
        tracker.close()
        atomic_write_json(out / "DONE", summary)
        if not keep_checkpoints:
            shutil.rmtree(out / "checkpoints", ignore_errors=True)
    dist.barrier()
    return dict(json.loads((out / "DONE").read_text()))


def move_aside(out: Path, why: str, mlflow_settings: dict[str, Any] | None) -> None:
    """Move a previous run's files into out/previous/<time>/ (nothing is deleted), and retag its
    MLflow run so that the new run gets a run of its own."""
    present = [name for name in RUN_FILES if (out / name).exists()]
    if not present:
        return
    aside = out / "previous" / time.strftime("%Y%m%d-%H%M%S")
    aside.mkdir(parents=True, exist_ok=True)
    run_id = (out / "mlflow_run_id").read_text().strip() if (out / "mlflow_run_id").is_file() else None
    for name in present:
        (out / name).rename(aside / name)
    if run_id and mlflow_settings and mlflow_settings.get("enabled"):
        from meml.core.tracking import retire_run

        retire_run(mlflow_settings, run_id, aside.name)
    print(f"rl: {why}; the previous run's files are in {aside}", file=sys.stderr)


def same_params(out: Path, params: dict[str, Any] | None) -> bool:
    """True when out/cell.json holds these params, or when neither exists (nothing to compare)."""
    path = out / "cell.json"
    if not path.is_file():
        return not (out / "checkpoints").exists()
    return bool(json.loads(path.read_text()) == json.loads(json.dumps(params or {})))


def hsft_solutions(source: str, records: list[Record], experts_dir: str | Path) -> Any:
    """The solution stored for a hard example: the ground-truth rationale (default), or the
    expert's own trajectory for that question when one exists (`expert_trajectory`)."""
    by_id = {r.id: r for r in records}
    if source == "ground_truth":
        return lambda h: by_id[h.question_id].rationale
    if source != "expert_trajectory":
        raise DataError(f"unknown HSFT solution source '{source}'; known: ground_truth, expert_trajectory")
    trajectories: dict[tuple[str, int], str] = {}
    for path in sorted(Path(experts_dir).glob("e*.jsonl")):
        for record, k, completion in read_trajectories(path, by_id):
            trajectories[(record.id, k)] = completion
    return lambda h: trajectories.get((h.question_id, h.expert), by_id[h.question_id].rationale)
