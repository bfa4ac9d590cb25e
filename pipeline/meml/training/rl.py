"""RIEL, the RL stage: one GRPO loop for GRPO, Dr.GRPO and MEML-GRPO.

Read it top to bottom. A method is a set of switches (config `methods.<name>`), never a code path:
    rl_experts  which experts sample rollouts (one for the Expert1 baselines, three for MoE / MEML)
    advantage   "grpo" (subtract the subgroup mean, divide by its std) or "drgrpo" (no std, constant
                length normaliser)
    iml         inter-expert mutual learning, weighted by rl.lambda_iml
    hsft        the hard-example buffer and its SFT updates, weighted by rl.lambda_sft
    dynamic_sampling  (a baseline, not MEML) up to this many extra rounds replace the questions on
                which every rollout got the same reward, as DAPO's dynamic sampling does

One step, for Q questions and E experts:
    1. sample Q questions (a seeded permutation per epoch; the position is checkpointed)
    2. every expert e samples n_e rollouts under its own system prompt, all in one batched call
                                                                         -> tensors (Q, E, R)
       `split`: G rollouts shared among the experts (8 -> 3/3/2); `per_expert`: G each
    3. rewards from the answer checker                                  -> rewards, correct (Q, E, R)
       (dynamic sampling: questions without any reward spread are replaced by fresh ones)
    4. advantages inside each (question, expert) subgroup                -> (Q, E, R)
    5. IML pairs: best and worst expert per question, O+ a correct rollout of the best
    6. HSFT: experts failing a question more often than K/G offer it to the buffer; when the buffer
       is full its contents become an SFT batch and it is emptied
    7. `updates_per_batch` optimiser steps on
           L = L_policy + lambda_iml * L_IML + lambda_sft * L_SFT   (L_SFT on the first update only)
    8. metrics; a checkpoint every `checkpoint_every` steps

Steps 1-3 live in groups.py, 4-7 in rl_step.py, 8 in rl_metrics.py; loading, resuming, checkpoints
and the finished run in rl_run.py. This file is the loop.

Under `accelerate launch` (distributed.py) each process runs this loop on its block of whole
questions (Q / processes), so steps 4-6 see complete groups; offers to the buffer are gathered,
gradients averaged, metrics gathered, and the main process alone writes. After each update the
rollout engine's weights are synced and checked (rollout.check_synced). Precision: precision.py.
"""

from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meml.core.answers import RewardConfig
from meml.core.environment import environment_record
from meml.core.io import locked
from meml.core.precision import Precision, resolve
from meml.core.records import Record
from meml.core.tracking import Tracker
from meml.data.experts import DEFAULT_PROMPTS
from meml.training import rl_run
from meml.training.distributed import Dist
from meml.training.groups import Groups, QuestionOrder, sample_groups, sample_step
from meml.training.rl_metrics import step_metrics
from meml.training.rl_settings import RLSettings, rollouts_per_expert
from meml.training.rl_step import (
    HSFTBatch,
    advantages_step,
    completion_logprobs,
    hsft_step,
    iml_step,
    update_step,
)
from meml.training.rollout import RolloutEngine, check_synced

__all__ = ["Groups", "Method", "QuestionOrder", "completion_logprobs", "run_rl", "sample_groups"]


@dataclass(frozen=True)
class Method:
    name: str
    sft_experts: tuple[int, ...]
    rl_experts: tuple[int, ...]
    advantage: str
    iml: bool
    hsft: bool
    dynamic_sampling: int = 0

    @classmethod
    def from_config(cls, name: str, switches: dict[str, Any]) -> Method:
        return cls(
            name,
            tuple(switches["sft_experts"]),
            tuple(switches["rl_experts"]),
            switches["advantage"],
            bool(switches["iml"]),
            bool(switches["hsft"]),
            int(switches.get("dynamic_sampling") or 0),
        )


@locked("out_dir")  # one writer per run folder
def run_rl(
    settings: dict[str, Any],
    method: Method,
    model_dir: str | Path,
    data_dir: str | Path,
    experts_dir: str | Path,
    out_dir: str | Path,
    *,
    seed: int = 0,
    prompts: tuple[str, ...] | list[str] = DEFAULT_PROMPTS,
    reward_mode: str = "lenient",
    format_bonus: float = 0.0,
    cell_key: str = "",
    params: dict[str, Any] | None = None,
    mlflow_params: dict[str, Any] | None = None,
    mlflow_settings: dict[str, Any] | None = None,
    mlflow_tags: dict[str, str] | None = None,
    engine: RolloutEngine | None = None,
    precision: Precision | None = None,
    stop_after: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Train `model_dir` with RL; writes out_dir/{cell.json, metrics.jsonl, model/, DONE}.

    Resumes from the newest checkpoint in out_dir/checkpoints that verifies, but only when `params`
    (the values that define the run, kept in cell.json) are unchanged: otherwise the old files
    belong to another experiment and are moved into out_dir/previous/ once the new run has been
    set up and checked (a rerun that fails never costs the finished run). A finished run whose
    DONE was removed (`snakemake --forcerun`) is trained again, not resumed at its last step. One
    process at a time may write the folder (io.run_lock). Under `accelerate launch` each process
    trains a replica on its share of the questions (distributed.py); one process runs alone
    otherwise. `stop_after` simulates a kill (tests)."""
    from tqdm import tqdm

    precision = precision or resolve("cpu")
    dist = Dist.from_env(precision.device)
    out = Path(out_dir)
    if rl_run.same_params(out, params) and (out / "DONE").is_file():
        return dict(json.loads((out / "DONE").read_text()))
    s = RLSettings.from_config(settings)  # every key read here, once
    Q, G, experts = s.questions_per_step, s.group_size, list(method.rl_experts)
    counts = rollouts_per_expert(G, len(experts), s.spread)  # n_e rollouts of expert e; R = max(counts)
    reward_config = RewardConfig(reward_mode, format_bonus)

    # load and check everything that can fail, then start (or resume) in the folder
    run = rl_run.load(s, experts, model_dir, data_dir, experts_dir, seed, precision, dist, engine)
    rl_run.start(out, params, run.steps, mlflow_settings, dist)
    first = rl_run.resume(run, out, seed, dist)
    if first and dist.is_main:  # the job's log says so: after a cancelled or killed job, no step is redone
        print(f"[meml] resuming {out} at step {first} of {run.steps} (its newest checkpoint)", file=sys.stderr)
    policy = run.learner.policy
    run.engine.sync_weights(policy)
    check_synced(run.engine, policy)
    environment = environment_record(model_dir, precision.device)  # DONE and MLflow params: core/environment.py
    logged = {**(mlflow_params or params or {}), "environment": environment}
    tracker = None
    if dist.is_main:
        tracker = Tracker(out, cell_key or method.name, logged, mlflow_settings, first, tags=mlflow_tags)

    def sample(batch: list[Record]) -> Groups:  # rollouts of every RL expert, scored  (Qp, E, R)
        return sample_groups(run.engine, run.tokenizer, batch, experts, counts, s.sampling, prompts, reward_config)

    shown = progress and dist.is_main
    bar = tqdm(range(first, run.steps), desc=f"RL {method.name}", initial=first, total=run.steps, disable=not shown)
    for step in bar:
        t0 = time.time()
        # 1.-3. this process's Qp = Q / processes questions, rollouts and rewards        (Qp, E, R)
        sampled = sample_step(dist, run.records, run.order, Q, sum(counts), method.dynamic_sampling, sample)
        groups, rollout_seconds = sampled.groups, time.time() - t0
        # 4. advantages inside each (question, expert) subgroup, flattened          (N,) sequences
        seqs = advantages_step(groups, counts, method.advantage, run.stops.end_of_turn)
        # 5. IML pairs: best and worst expert per question; ties broken by a seeded draw (resume-safe)
        iml = iml_step(groups, method.iml, random.Random(f"iml-{seed}-{step}-{dist.rank}"))
        # 6. HSFT: failures offered to the buffer (identical in every process); a full one is drained
        hsft = HSFTBatch()
        if method.hsft:
            hsft = hsft_step(
                run.buf, groups, experts, counts, dist, run.by_id, run.solution, run.tokenizer, prompts, run.stops
            )
        # 7. L = L_policy + lambda_iml L_IML + lambda_sft L_SFT, then the engine gets the new weights
        stats = update_step(run.learner, s, method.advantage, seqs, iml, hsft, dist)
        run.engine.sync_weights(policy)
        check_synced(run.engine, policy)  # a stale engine would sample from old weights without a sound
        # 8. metrics, over every process's questions
        seconds = time.time() - t0
        metrics = step_metrics(dist, run, sampled, seqs, iml, hsft, experts, counts, stats, seconds, rollout_seconds)
        if tracker is not None:
            tracker.log(step, metrics)
        bar.set_postfix(reward=f"{metrics['reward/mean']:.2f}", all_wrong=f"{metrics['subgroups/all_wrong']:.2f}")
        # 9. a checkpoint every checkpoint_every steps and at the end
        done_steps = step + 1
        if done_steps % s.checkpoint_every == 0 or done_steps == run.steps:
            rl_run.save(run, out, done_steps, dist, tracker)
        if stop_after is not None and done_steps >= stop_after and done_steps < run.steps:
            if tracker is not None:
                tracker.close("KILLED")
            raise KeyboardInterrupt(f"stopped after step {done_steps} (simulated kill)")

    return rl_run.finish(run, out, method.name, precision, dist, tracker, environment, s.keep_checkpoints)
