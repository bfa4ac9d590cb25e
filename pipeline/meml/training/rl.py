"""RIEL, the RL stage: one GRPO loop for GRPO, Dr.GRPO and MEML-GRPO, to read top to bottom:
the settings (read once from the config into types), what a run holds, the loop, and its steps.

A method is a set of switches (config `methods.<name>`), never a code path:
    rl_experts  which experts sample rollouts (one for the Expert1 baselines, three for MoE / MEML)
    advantage   "grpo" (subtract the subgroup mean, divide by its std) or "drgrpo" (no std, constant
                length normaliser)
    iml         inter-expert mutual learning, weighted by rl.lambda_iml
    hsft        the hard-example buffer and its SFT updates, weighted by rl.lambda_sft
    dynamic_sampling  (a baseline, not MEML) up to this many extra rounds replace the questions on
                which every rollout got the same reward, as DAPO's dynamic sampling does
    shuffle_advantages  (a null control, not a method) the step's advantages are permuted among its
                rollouts before the update: the same update sizes with the reward's information
                removed, so what it does to held-out accuracy is what noise alone does

One step, for Q questions and E experts:
    1. sample Q questions (a seeded permutation per epoch; the position is checkpointed)
    2. every expert e samples n_e rollouts under its own system prompt, all in one batched call
                                                                         -> tensors (Q, E, R)
       `split`: G rollouts shared among the experts (8 -> 3/3/2, which expert gets the 2 turning
       from question to question); `per_expert`: G each
    3. rewards from the answer checker (a rollout cut at max_new_tokens scores 0)
                                                                         -> rewards, correct (Q, E, R)
       (dynamic sampling: questions without any reward spread are replaced by fresh ones)
    4. advantages inside each (question, expert) subgroup                -> (Q, E, R), flattened to N
    5. IML pairs: best and worst expert per question, O+ a correct rollout of the best
    6. HSFT: experts failing a question more often than K/G offer it to the buffer; when the buffer
       is full its contents become an SFT batch and it is emptied
    7. `updates_per_batch` optimiser steps on
           L = L_policy + lambda_iml * L_IML + lambda_sft * L_SFT   (L_SFT on the first update only;
       under rl.buffer.update: separate the drained batch takes a step of its own at its sft_lr),
       every log-prob at the sampling temperature, in micro-batches of rl.micro_batch_tokens
    8. metrics, and a checkpoint every `checkpoint_every` steps

Here: the settings, loading, the loop, steps 4-8. Elsewhere, one idea each: the formulas
(losses.py), the buffer (buffer.py), steps 1-3 (groups.py), the rollout engines (engines.py), the
update's log-probs (scoring.py), the run folder's start, resume, checkpoints and finish
(rl_run.py), several processes (distributed.py), precision (core/precision.py).

Under `accelerate launch` each process runs this loop on its block of whole questions
(Q / processes), so steps 4-6 see complete groups; offers to the buffer are gathered, gradients
averaged, metrics gathered, and the main process alone writes. After each update the rollout
engine's weights are synced and checked (rollout.check_synced).
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from meml.core.answers import RewardConfig
from meml.core.attention import attention_kwargs
from meml.core.config import dataset_rl, rollouts_per_expert
from meml.core.environment import environment_record
from meml.core.io import DataError, locked
from meml.core.precision import Precision, resolve
from meml.core.records import Record, read_records
from meml.core.stops import stop_tokens, target_ids
from meml.core.tracking import RunTracking, Tracker
from meml.data.experts import DEFAULT_PROMPTS, chat_messages, read_trajectories
from meml.training import rl_run
from meml.training.buffer import HardExample, HardExampleBuffer
from meml.training.distributed import Dist
from meml.training.engines import make_engine
from meml.training.groups import Groups, QuestionOrder, Sampled, sample_groups, sample_step
from meml.training.lengths import check_fits, over_cap_shares
from meml.training.losses import (
    IMLPair,
    PolicyBatch,
    iml_loss,
    iml_pairs,
    policy_loss,
    sft_loss,
    subgroup_advantages,
)
from meml.training.rollout import RolloutEngine, Sampling, check_synced, prompt_ids, weights_fingerprint
from meml.training.rollout_vllm import VLLMSettings
from meml.training.scoring import completion_logprobs, micro_batches, scores_whole_rows

__all__ = ["Method", "RLArgs", "RLPaths", "RLSettings", "run_rl", "sampling_of"]


# ---------------------------------------------------------------------------------------------------
# Settings: every key read once, here, into typed fields (the defaults live in config/default.yaml
# alone, so a missing key is an error that names it). No raw settings dict goes past these types.


def _read(cls: type, section: dict[str, Any], where: str) -> Any:
    """`cls` (a dataclass) from its config section: each field from the key of its name, converted
    to the field's type; a key missing is an error naming it."""
    import typing

    hints = typing.get_type_hints(cls)
    values = {}
    for key in dataclasses.fields(cls):
        name = key.name
        if name not in section:
            raise DataError(f"missing RL setting {where}.{name} (config/default.yaml has every key)")
        value, kind = section[name], hints[name]
        if hasattr(kind, "from_config"):  # a nested section with its own reader (rl.vllm)
            values[name] = kind.from_config(value or {})
        elif isinstance(kind, type) and dataclasses.is_dataclass(kind):  # a nested section (rl.buffer)
            if not isinstance(value, dict):
                raise DataError(f"missing RL setting {where}.{name} (config/default.yaml has every key)")
            values[name] = _read(kind, value, f"{where}.{name}")
        else:  # int, float, str, bool, or one of them | None
            base = next(t for t in typing.get_args(kind) or (kind,) if t is not type(None))
            values[name] = None if value is None else base(value)
    return cls(**values)


@dataclass(frozen=True)
class BufferSettings:
    """rl.buffer: HSFT's hard-example buffer."""

    capacity: int  # B: a flush (an SFT update) when this many hard examples are held
    threshold: float  # K/G: an expert failing more than this share of its rollouts offers the question
    insert_prob: float  # the chance an offered question goes in
    solution: str  # ground_truth | expert_trajectory: what the SFT update learns
    update: str  # joint (lambda_sft * L_SFT joins the RL loss) | separate (its own step at sft_lr)
    sft_lr: float  # the separate SFT step's learning rate


@dataclass(frozen=True)
class RLSettings:
    """`rl`, with the data set's `rl_by_dataset` entry and the method's own `rl` laid over it
    (core/config.method_rl). config/schema.yaml describes each key; here, what the loop does with it."""

    steps: int  # RL steps (optimiser steps x updates_per_batch), unless epochs is set
    epochs: float | None  # passes over the training questions; None: `steps`
    questions_per_step: int  # Q
    group_size: int  # G rollouts per question, spread over the experts
    spread: str  # split: G shared among the experts; per_expert: G each
    lr: float  # AdamW's learning rate of the policy
    warmup_steps: int  # linear warm-up of lr over this many RL steps
    updates_per_batch: int  # optimiser steps on one batch of rollouts (> 1: the clipped ratio acts)
    clip_eps: float  # the PPO clip of the ratio, [1 - clip_eps, 1 + clip_eps]
    beta: float  # KL to the reference model (0: none loaded)
    max_grad_norm: float  # gradient clipping of the whole update
    max_new_tokens: int  # the rollouts' token cap; an answer cut there scores 0
    max_truncated_share: float  # refuse to start when more of an expert's SFT trajectories exceed the cap
    temperature: float  # sampling temperature, and the one the learner scores the tokens at
    top_p: float  # nucleus sampling of the rollouts
    lambda_iml: float  # weight of L_IML in the step's loss
    lambda_sft: float  # weight of L_SFT (HSFT's drained buffer) in the step's loss
    checkpoint_every: int  # RL steps between checkpoints (and one at the end)
    rollout_batch_size: int  # sequences the rollout engine decodes at once
    micro_batch_tokens: int  # the update's micro-batch: at most this many prompt + completion tokens
    engine: str  # the rollout engine: kv, hf, hf-copy, vllm (training/engines.py)
    keep_checkpoints: bool  # False: the last checkpoint goes once DONE is written (how a run ends, not its result)
    buffer: BufferSettings  # rl.buffer
    vllm: VLLMSettings  # rl.vllm: the vLLM engine's settings

    @classmethod
    def from_config(cls, rl: dict[str, Any]) -> RLSettings:
        settings: RLSettings = _read(cls, rl, "rl")
        return settings

    @property
    def sampling(self) -> Sampling:
        """How rollouts are sampled: the one place a run's Sampling is built from the config."""
        return Sampling(self.max_new_tokens, self.temperature, self.top_p)


def round_off_settings(s: RLSettings) -> dict[str, Any]:
    """The run keys (core/config.RUN_KEYS) that move an RL run's numbers at round-off only, kept with the
    machine's record (DONE's `environment`, the MLflow params `environment.*`) since they are no part of
    the cell: the update's micro-batch (another grouping of its sums), and vLLM's memory and kernels
    (how many requests it batches, CUDA graphs or eager), where vLLM samples."""
    out: dict[str, Any] = {"micro_batch_tokens": s.micro_batch_tokens}
    if s.engine == "vllm":
        v = s.vllm
        out["vllm"] = {"gpu_memory_utilization": v.gpu_memory_utilization, "cpu_kv_cache_gib": v.cpu_kv_cache_gib,
                       "enforce_eager": v.enforce_eager}  # fmt: skip
    return out


def sampling_of(cfg: dict[str, Any], dataset: str) -> Sampling:
    """RL's sampling on a data set (rl with its rl_by_dataset entry): what the calibration gate and
    the complementarity analysis sample with."""
    return RLSettings.from_config(dataset_rl(cfg, dataset)).sampling


@dataclass(frozen=True)
class Method:
    """A method's switches (the module's docstring says what each does)."""

    name: str
    sft_experts: tuple[int, ...]
    rl_experts: tuple[int, ...]
    advantage: str
    iml: bool
    hsft: bool
    dynamic_sampling: int = 0
    shuffle_advantages: bool = False

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
            bool(switches.get("shuffle_advantages") or False),
        )


@dataclass(frozen=True)
class RLArgs:
    """What one RL run is, apart from where it reads and writes (jobs/training.py builds it from
    the config and the cell)."""

    settings: RLSettings
    method: Method
    seed: int = 0
    prompts: tuple[str, ...] = DEFAULT_PROMPTS  # the experts' system prompts
    reward: RewardConfig = field(default_factory=RewardConfig)  # the answer checker's mode, a format bonus
    precision: Precision | None = None  # None: float32 on the CPU
    # the values that define the cell, kept in cell.json: an old run in the folder is resumed only
    # when they are unchanged (the rest of the config may change without touching the run)
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RLPaths:
    model: Path  # the model the run starts from (the method's SFT model)
    data: Path  # the data set's folder: train.jsonl
    experts: Path  # the experts' SFT trajectories: the length check, and HSFT's expert_trajectory
    out: Path  # the run's folder: cell.json, metrics.jsonl, checkpoints/, model/, DONE

    def __post_init__(self) -> None:  # str or Path in, Path kept
        for name in ("model", "data", "experts", "out"):
            object.__setattr__(self, name, Path(getattr(self, name)))


# ---------------------------------------------------------------------------------------------------
# What a run holds across its steps, loaded and checked before the run folder is touched.


@dataclass
class Learner:
    """The policy and what steps it: the optimisers, the schedule, the frozen reference (beta > 0)."""

    policy: Any
    reference: Any
    optimizer: torch.optim.Optimizer
    sft_optimizer: torch.optim.Optimizer  # rl.buffer.update: separate
    scheduler: Any
    precision: Precision
    pad: int


@dataclass
class RunState:
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

    def checkpointed(self) -> dict[str, Any]:
        """What a checkpoint keeps, by name: each has state_dict and load_state_dict."""
        learner = self.learner
        return {
            "model": learner.policy,
            "optimizer": learner.optimizer,
            "sft_optimizer": learner.sft_optimizer,
            "scheduler": learner.scheduler,
            "order": self.order,
            "buffer": self.buf,
        }


def load(args: RLArgs, paths: RLPaths, precision: Precision, dist: Dist, engine: RolloutEngine | None) -> RunState:
    """The models, optimisers, engine, data and buffer, seeded; the trajectories' lengths checked
    against the cap (lengths.check_fits) before anything is written."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    s, experts = args.settings, list(args.method.rl_experts)
    torch.manual_seed(args.seed)
    random.seed(args.seed)  # nothing draws from it, but checkpoints keep its state: the same bytes
    tokenizer = AutoTokenizer.from_pretrained(paths.model)
    # fp32 master weights in every precision; bf16 runs compute under autocast (precision.py)
    device = dist.device
    policy: Any = AutoModelForCausalLM.from_pretrained(paths.model, dtype=torch.float32, **attention_kwargs(device))
    policy.to(torch.device(dist.device))
    if precision.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
    policy.train()
    reference: Any = None
    if s.beta > 0:  # in the policy's precision (fp32 weights, the same autocast): KL 0 at step 0
        reference = AutoModelForCausalLM.from_pretrained(
            paths.model, dtype=torch.float32, **attention_kwargs(dist.device)
        )
        reference.to(torch.device(dist.device)).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=s.lr, weight_decay=0.0)
    sft_optimizer = torch.optim.AdamW(policy.parameters(), lr=s.buffer.sft_lr, weight_decay=0.0)
    warmup = max(1, s.warmup_steps)  # in RL steps: the scheduler steps once a step (update_step)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / warmup))
    engine = engine or make_engine(
        s.engine, policy, paths.model, tokenizer, s.rollout_batch_size, s.vllm, precision, args.seed, dist.rank
    )
    records = read_records(paths.data / "train.jsonl")
    by_id = {r.id: r for r in records}
    over_cap = over_cap_shares(tokenizer, paths.experts, experts, by_id, s.max_new_tokens)
    check_fits(over_cap, s.max_new_tokens, s.max_truncated_share, paths.experts)
    return RunState(
        Learner(policy, reference, optimizer, sft_optimizer, scheduler, precision, tokenizer.pad_token_id),
        engine,
        tokenizer,
        records,
        by_id,
        over_cap,
        hsft_solutions(s.buffer.solution, records, paths.experts),
        HardExampleBuffer(s.buffer.capacity, s.buffer.threshold, s.buffer.insert_prob, args.seed),
        QuestionOrder(len(records), args.seed),  # the same order in every process
        stop_tokens(tokenizer),
        s.steps if s.epochs is None else math.ceil(s.epochs * len(records) / s.questions_per_step),
    )


def hsft_solutions(source: str, records: list[Record], experts_dir: Path) -> Any:
    """O_gt, the solution HSFT learns for a hard example: the ground-truth rationale (default), or
    the expert's own SFT trajectory for that question when one exists (`expert_trajectory`)."""
    by_id = {r.id: r for r in records}
    if source == "ground_truth":
        return lambda h: by_id[h.question_id].rationale
    if source != "expert_trajectory":
        raise DataError(f"unknown HSFT solution source '{source}'; known: ground_truth, expert_trajectory")
    trajectories: dict[tuple[str, int], str] = {}
    for path in sorted(experts_dir.glob("e*.jsonl")):
        for record, k, completion in read_trajectories(path, by_id):
            trajectories[(record.id, k)] = completion
    return lambda h: trajectories.get((h.question_id, h.expert), by_id[h.question_id].rationale)


# HSFT's SFT term is a likelihood of solutions the model never sampled (the buffer's gold
# rationales), so it is scored as MEF scores them, at temperature 1, in both buffer modes; only
# the model's own rollouts (the policy rows, and IML's O+) are scored at the sampling temperature.
SUPERVISED_TEMPERATURE = 1.0


# ---------------------------------------------------------------------------------------------------
# The loop.


@locked("paths.out")  # one writer per run folder
def run_rl(
    args: RLArgs,
    paths: RLPaths,
    tracking: RunTracking | None = None,
    *,
    engine: RolloutEngine | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Train `paths.model` with RL; writes paths.out/{cell.json, metrics.jsonl, model/, DONE}.
    `tracking`: the MLflow run the metrics go to as well (None: metrics.jsonl only); `engine`: a
    rollout engine to use instead of rl.engine's (tests). Stopped by Ctrl-C, the run's MLflow run
    is marked KILLED; the next start resumes it.

    Resumes from the newest checkpoint that verifies, but only when `args.params` are unchanged:
    otherwise the old files belong to another experiment and are moved into out/previous/ once the
    new run has been set up and checked (a rerun that fails never costs the finished run). A
    finished run whose DONE was removed (`snakemake --forcerun`) is trained again, not resumed at
    its last step. One process at a time may write the folder (io.run_lock)."""
    from tqdm import tqdm

    s, method, out = args.settings, args.method, paths.out
    precision = args.precision or resolve("cpu")
    dist = Dist.from_env(precision.device)
    if rl_run.same_params(out, args.params) and (out / "DONE").is_file():
        return rl_run.settle(out, s.keep_checkpoints, dist)  # finished (what follows DONE, if a crash cut it)
    tracking = tracking or RunTracking(method.name, args.params)
    Q, experts = s.questions_per_step, list(method.rl_experts)
    counts = rollouts_per_expert(s.group_size, len(experts), s.spread)  # n_e, turned per question; R = max(counts)

    # load and check everything that can fail, then start (or resume) in the folder
    run = load(args, paths, precision, dist, engine)
    tracker = None
    try:
        rl_run.start(out, args.params, run.steps, tracking.mlflow, dist)
        first = rl_run.resume(out, run.checkpointed(), args.seed, dist)
        if first and dist.is_main:  # the job's log says so: after a cancelled or killed job, no step is redone
            print(f"[meml] resuming {out} at step {first} of {run.steps} (its newest checkpoint)", file=sys.stderr)
        policy = run.learner.policy
        run.engine.sync_weights(policy)
        check_synced(run.engine, policy)
        environment = {
            **environment_record(paths.model, precision.device),
            **round_off_settings(s),
        }  # DONE, MLflow params
        if dist.is_main:
            logged = {**tracking.params, "environment": environment}
            tracker = Tracker(out, tracking.key, logged, tracking.mlflow, first, tags=tracking.tags)

        def sample(batch: list[Record]) -> Groups:  # rollouts of every RL expert, scored  (Qp, E, R)
            return sample_groups(
                run.engine, run.tokenizer, batch, experts, counts, s.sampling, args.prompts, args.reward
            )

        shown = progress and dist.is_main
        bar = tqdm(range(first, run.steps), desc=f"RL {method.name}", initial=first, total=run.steps, disable=not shown)
        for step in bar:
            t0 = time.time()
            # 1.-3. this process's Qp = Q / processes questions, rollouts and rewards        (Qp, E, R)
            sampled = sample_step(dist, run.records, run.order, Q, sum(counts), method.dynamic_sampling, sample)
            groups, rollout_seconds = sampled.groups, time.time() - t0
            # 4. advantages inside each (question, expert) subgroup, flattened          (N,) sequences
            seqs = advantages_step(groups, method.advantage, run.stops.end_of_turn)
            if method.shuffle_advantages:  # the null control: same sizes, no information (seeded: resume-safe)
                seqs = shuffled(seqs, random.Random(f"shuffle-{args.seed}-{step}-{dist.rank}"))
            # 5. IML pairs: best and worst expert per question; ties broken by a seeded draw (resume-safe)
            tie_break = random.Random(f"iml-{args.seed}-{step}-{dist.rank}")
            iml = iml_step(groups, tie_break, args.reward.format_bonus) if method.iml else IMLBatch([])
            # 6. HSFT: failures offered to the buffer (identical in every process); a full one is drained
            hsft = hsft_step(run, groups, experts, dist, args.prompts) if method.hsft else HSFTBatch()
            # 7. L = L_policy + lambda_iml L_IML + lambda_sft L_SFT, then the engine gets the new weights
            stats = update_step(run.learner, s, method.advantage, seqs, iml, hsft, dist)
            run.engine.sync_weights(policy)
            sync = check_synced(run.engine, policy)  # a stale engine would sample from old weights without a sound
            # 8. metrics, over every process's questions
            seconds = time.time() - t0
            outcome = StepOutcome(sampled, seqs, iml, hsft, stats, seconds, rollout_seconds, sync)
            metrics = step_metrics(dist, run, experts, outcome)
            if tracker is not None:
                tracker.log(step, metrics)
            bar.set_postfix(reward=f"{metrics['reward/mean']:.2f}", all_wrong=f"{metrics['subgroups/all_wrong']:.2f}")
            # ... and a checkpoint every checkpoint_every steps and at the end
            done_steps = step + 1
            if done_steps % s.checkpoint_every == 0 or done_steps == run.steps:
                rl_run.save(out, done_steps, run.checkpointed(), dist, tracker)

        summary = {
            "method": method.name,
            "steps": run.steps,
            "processes": dist.world,
            "precision": precision.dtype,
            "trajectories_over_max_new_tokens": run.over_cap,
        }
        return rl_run.finish(out, run.tokenizer, policy, summary, environment, dist, tracker, s.keep_checkpoints)
    except KeyboardInterrupt:
        if tracker is not None:
            tracker.close("KILLED")
        raise
    finally:
        if engine is None:  # the engine this run started: its memory goes back (a next run may start one)
            close = getattr(run.engine, "close", None)
            if close is not None:
                close()


# ---------------------------------------------------------------------------------------------------
# Steps 4-8: from scored rollouts to an optimiser step and the step's metrics.


@dataclass(frozen=True)
class Sequences:
    """Step 4's output: the N valid rollouts, flattened in (question, expert, rollout) order."""

    positions: list[tuple[int, int, int]]  # (q, e, r) of each sequence
    prompts: list[list[int]]
    completions: list[list[int]]
    advantages: Tensor  # (N,)
    sampled_logp: list[tuple[float, ...] | None]  # each token's log p where the engine drew it


def advantages_step(groups: Groups, advantage: str, end_of_turn: int) -> Sequences:
    """4. Advantages inside each (question, expert) subgroup (Q, E, R), flattened to N sequences
    (an empty completion is scored as the end-of-turn token alone)."""
    advantages = subgroup_advantages(groups.rewards, groups.valid, advantage)  # (Q, E, R)
    positions = [(q, e, r) for q, row in enumerate(groups.counts) for e, n in enumerate(row) for r in range(n)]
    drawn = [groups.completions[q][e][r] for q, e, r in positions]
    return Sequences(
        positions,
        [groups.prompt[q][e] for q, e, _ in positions],
        [c.token_ids or [end_of_turn] for c in drawn],
        torch.tensor([float(advantages[q, e, r]) for q, e, r in positions]),
        [c.logprobs if c.token_ids else None for c in drawn],
    )


def shuffled(seqs: Sequences, rng: random.Random) -> Sequences:
    """The step's advantages permuted among its rollouts (the shuffled-advantage control): each
    rollout keeps its tokens and gets another rollout's advantage, so the update has the real one's
    sizes and sparsity but no relation to which completion was right."""
    order = list(range(len(seqs.advantages)))
    rng.shuffle(order)
    return dataclasses.replace(seqs, advantages=seqs.advantages[order])


@dataclass(frozen=True)
class IMLBatch:
    """Step 5's output: for each pair, the worst expert's prompt and the best expert's rollout (its
    score under the best expert's own prompt is its row of the policy pass)."""

    pairs: list[IMLPair]
    weak: list[list[int]] = field(default_factory=list)  # the same question under the worst
    tokens: list[list[int]] = field(default_factory=list)  # O+, a correct rollout of the best


def iml_step(groups: Groups, tie_break: random.Random, format_bonus: float) -> IMLBatch:
    """5. Best and worst expert per question (whole groups: one process each); rewards compared as
    the decimals they stand for (losses.exact_reward)."""
    pairs = iml_pairs(groups.rewards, groups.correct, groups.valid, tie_break, format_bonus)
    return IMLBatch(
        pairs,
        [groups.prompt[p.question][p.worst] for p in pairs],
        [groups.completions[p.question][p.best][p.rollout].token_ids for p in pairs],
    )


@dataclass(frozen=True)
class HSFTBatch:
    """Step 6's output: what the buffer took, what it gave up, and this process's SFT examples."""

    inserted: int = 0
    drained: list[HardExample] = field(default_factory=list)  # the whole flush (every process)
    prompts: list[list[int]] = field(default_factory=list)  # this process's share
    targets: list[list[int]] = field(default_factory=list)


def hsft_step(run: RunState, groups: Groups, experts: list[int], dist: Dist, prompts: tuple[str, ...]) -> HSFTBatch:
    """6. Each expert failing a question more often than K/G offers it (counts, so the threshold is
    exact); every process offers all processes' questions, so the buffers stay identical. A full
    buffer is drained into an SFT batch, shared among the processes."""
    offers = [  # (question, expert, failures, rollouts)
        (record.id, k, n - int(groups.correct[q, e, :n].sum()), n)
        for q, record in enumerate(groups.records)
        for e, (k, n) in enumerate(zip(experts, groups.counts[q], strict=True))
    ]
    inserted = 0
    for question_id, k, failures, n in [o for part in dist.gather(offers) for o in part]:
        inserted += run.buf.offer(HardExample(question_id, k), failures, n)
    if not run.buf.full:
        return HSFTBatch(inserted)
    drained = run.buf.drain()
    mine = drained[dist.rank :: dist.world]
    return HSFTBatch(
        inserted,
        drained,
        [prompt_ids(run.tokenizer, chat_messages(run.by_id[h.question_id], h.expert, prompts)) for h in mine],
        [target_ids(run.tokenizer, run.solution(h), run.stops) for h in mine],
    )


def update_step(
    learner: Learner, s: RLSettings, advantage: str, seqs: Sequences, iml: IMLBatch, hsft: HSFTBatch, dist: Dist
) -> dict[str, float]:
    """7. `updates_per_batch` optimiser steps on L = L_policy + lambda_iml L_IML + lambda_sft L_SFT
    (L_SFT on the first update only, under rl.buffer.update: joint); under `separate` the drained
    batch takes its own step at rl.buffer.sft_lr. Returns the first update's losses and entropy (over
    every rollout), the clipped share of the later updates (over the rows with a non-zero advantage:
    only they are updated), the step's relative weight change, and the gap between the engine's
    log-probs of the tokens it drew and the learner's at the same weights.

    Temperatures: the policy rows and IML's rows are scored at the sampling temperature T
    (completion_logprobs), so the ratio, the KL and the entropy are those of the policy that drew
    the rollouts, and IML compares two prompts' probabilities of O+ as it was drawn (its strong side
    is O+'s own policy row). HSFT's rows are scored at temperature 1 in both buffer modes: they are
    gold solutions the model never sampled, an NLL under the model as in MEF (SUPERVISED_TEMPERATURE).
    Each update runs in micro-batches of at most rl.micro_batch_tokens tokens
    (scoring.micro_batches), backward after each: the policy's rows first, then IML's, then HSFT's.
    Each loss divides by a constant of the whole batch (N rollouts, M pairs, B examples), so the
    micro-batches' gradients add up to the one-shot gradient of the same loss. The old and the
    reference log-probs are scored in the same micro-batches as the update, so the first update's
    ratio is exactly 1 (which is why the clipped share is taken over the later updates)."""
    policy, pad, precision, T = learner.policy, learner.pad, learner.precision, s.temperature
    device = next(policy.parameters()).device
    n, m = len(seqs.prompts), len(iml.pairs)
    t_max = max(len(c) for c in seqs.completions)
    whole = scores_whole_rows(policy)  # how the passes pad, which the micro-batches' budget counts
    advantages = seqs.advantages.to(device)
    strong_rows = _rows_of(seqs.positions, [(p.question, p.best, p.rollout) for p in iml.pairs])  # O+'s policy row
    # A row whose advantage is exactly 0 (its subgroup scored alike: most rows, under reward
    # sparsity) adds nothing to the loss or its gradient when beta is 0: it is scored without a
    # graph on the first update, for the step's entropy and sampler gap, and left out of the rest.
    # O+'s rows stay in: IML reads their log-probs.
    keep = set(strong_rows.values())
    active = [r for r in range(n) if s.beta > 0 or float(seqs.advantages[r]) != 0.0 or r in keep]
    idle = sorted(set(range(n)) - set(active))
    batches, idle_batches = _micro_batches_of(seqs, active, s, whole), _micro_batches_of(seqs, idle, s, whole)
    before = weights_before(policy)

    def score(rows: list[int], prompts: list[list[int]], targets: list[list[int]], entropy: bool = False,
              model: Any = policy, temperature: float = T):  # fmt: skip
        return completion_logprobs(
            model, [prompts[r] for r in rows], [targets[r] for r in rows], pad, entropy, temperature=temperature
        )

    def policy_rows_scored(model: Any) -> Tensor:  # (N, t_max), no graph
        out = torch.zeros((n, t_max), device=device)
        with torch.no_grad(), precision.autocast():
            for rows in batches:
                logp, _, _ = score(rows, seqs.prompts, seqs.completions, model=model)
                out[rows, : logp.shape[1]] = logp.float()
        return out

    old_logp = policy_rows_scored(policy) if s.updates_per_batch > 1 else None
    ref_logp = policy_rows_scored(learner.reference) if learner.reference is not None else None

    stats: dict[str, float] = {}
    later_clipped = later_tokens = 0.0  # the clip can act only after the first update
    for update in range(s.updates_per_batch):
        with_sft = bool(hsft.prompts) and update == 0 and s.buffer.update == "joint"
        learner.optimizer.zero_grad(set_to_none=True)
        now = torch.zeros((n, t_max), device=device)  # the policy rows' log-probs at these weights
        mask_all = torch.zeros((n, t_max), dtype=torch.bool, device=device)
        l_policy = l_iml = l_sft = 0.0
        clipped = tokens = kl_sum = entropy_sum = entropy_tokens = 0.0
        for rows in idle_batches if update == 0 else []:  # no gradient: the entropy and the sampler gap
            with torch.no_grad(), precision.autocast():
                logp, mask, entropy = score(rows, seqs.prompts, seqs.completions, entropy=True)
            now[rows, : logp.shape[1]], mask_all[rows, : logp.shape[1]] = logp.float(), mask
            entropy_sum += float((entropy * mask).sum()) if entropy is not None else 0.0
            entropy_tokens += float(mask.sum())
        for rows in batches:
            with precision.autocast():
                logp, mask, entropy = score(rows, seqs.prompts, seqs.completions, entropy=update == 0)
                t = logp.shape[1]
                rows_batch = PolicyBatch(
                    logp,
                    logp.detach() if old_logp is None else old_logp[rows, :t],
                    advantages[rows],
                    mask,
                    None if ref_logp is None else ref_logp[rows, :t],
                )
                pl = policy_loss(
                    rows_batch, advantage, clip_eps=s.clip_eps, length_constant=s.max_new_tokens, beta=s.beta,
                    rows_total=n,
                )  # fmt: skip
            pl.loss.backward()  # this micro-batch's graph is freed here
            now[rows, :t], mask_all[rows, :t] = logp.detach().float(), mask
            l_policy += pl.loss.item()
            clipped, tokens, kl_sum = clipped + pl.clipped, tokens + pl.tokens, kl_sum + pl.kl_sum
            if entropy is not None:
                entropy_sum += float((entropy * mask).sum())
                entropy_tokens += float(mask.sum())
        if update > 0:
            later_clipped, later_tokens = later_clipped + clipped, later_tokens + tokens
        # IML's rows: O+ under the worst expert's prompt, at T like O+'s strong side
        for rows in micro_batches(iml.weak, iml.tokens, s.micro_batch_tokens, whole) if m else []:
            with precision.autocast():
                logp, mask, _ = score(rows, iml.weak, iml.tokens)
                # the strong side, log p(O+ | Q, P_best), is O+'s own policy row at these weights
                # (the loss stops its gradient); on later updates each token is weighted by its
                # clipped importance ratio, since O+ was drawn by the batch's old policy
                strong_at = [strong_rows[r] for r in rows]
                t = logp.shape[1]
                strong = now[strong_at, :t]
                weight = None
                if old_logp is not None and update > 0:
                    weight = torch.exp(now[strong_at, :t] - old_logp[strong_at, :t]).clamp(
                        1 - s.clip_eps, 1 + s.clip_eps
                    )
                term = iml_loss(strong, logp, mask, weight, pairs_total=m)
            (s.lambda_iml * term).backward()
            l_iml += term.item()
        # HSFT's rows (first update only): gold solutions, at temperature 1
        for rows in micro_batches(hsft.prompts, hsft.targets, s.micro_batch_tokens, whole) if with_sft else []:
            with precision.autocast():
                logp, mask, _ = score(rows, hsft.prompts, hsft.targets, temperature=SUPERVISED_TEMPERATURE)
                term = sft_loss(logp, mask, examples_total=len(hsft.prompts))
            (s.lambda_sft * term).backward()
            l_sft += term.item()
        for p in policy.parameters():  # no active row: a zero gradient, as the loss of zeros gave
            if p.grad is None and p.requires_grad:
                p.grad = torch.zeros_like(p)
        dist.average_gradients(policy)  # the replicas take the same step
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), s.max_grad_norm)
        learner.optimizer.step()
        if update == 0:
            stats = {
                "loss/policy": l_policy,
                "loss/total": l_policy + s.lambda_iml * l_iml + s.lambda_sft * l_sft,
                "loss/iml": l_iml,
                "loss/sft": l_sft,
                "kl": kl_sum / max(tokens, 1.0),
                "entropy": entropy_sum / max(entropy_tokens, 1.0),
                "grad_norm": float(grad_norm),
                **sampler_gap(seqs, now, mask_all),
            }
    stats["clip_fraction"] = later_clipped / max(later_tokens, 1.0)  # 0 with one update a batch
    learner.scheduler.step()  # once a step: rl.warmup_steps counts RL steps, not optimiser updates
    if hsft.drained and s.buffer.update == "separate":  # every process steps (its share may be empty)
        stats["loss/sft"] = _separate_sft_step(learner, s, hsft, dist)
    stats["update/relative_change"] = relative_change(policy, before)
    return stats


def weights_before(policy: Any) -> list[Tensor]:
    """A copy of the weights before the step, on the CPU (a GPU keeps no second copy)."""
    return [p.detach().to("cpu", copy=True) for p in policy.parameters()]


def relative_change(policy: Any, before: list[Tensor]) -> float:
    """||theta_after - theta_before|| / ||theta_before|| over every weight: how far one RL step
    moves the model, the figure to read beside the learning rate (a step that moves the weights
    by a large share of their size on noisy advantages drifts, whatever the loss says)."""
    moved = total = 0.0
    with torch.no_grad():
        for p, b in zip(policy.parameters(), before, strict=True):
            moved += float((p.detach().cpu().double() - b.double()).pow(2).sum())
            total += float(b.double().pow(2).sum())
    return math.sqrt(moved / max(total, 1e-30))


def _micro_batches_of(seqs: Sequences, rows: list[int], s: RLSettings, whole: bool) -> list[list[int]]:
    """scoring.micro_batches over a subset of the policy rows, in the rows' own numbering."""
    prompts, completions = [seqs.prompts[r] for r in rows], [seqs.completions[r] for r in rows]
    cut = micro_batches(prompts, completions, s.micro_batch_tokens, whole)
    return [[rows[i] for i in batch] for batch in cut] if rows else []


def _rows_of(positions: list[tuple[int, int, int]], wanted: list[tuple[int, int, int]]) -> dict[int, int]:
    """{i: the row of positions holding wanted[i]}, found in one pass."""
    where = {position: row for row, position in enumerate(positions)}
    return {i: where[w] for i, w in enumerate(wanted)}


def sampler_gap(seqs: Sequences, learner_logp: Tensor, mask: Tensor) -> dict[str, float]:
    """|engine log p - learner log p| over the tokens the engine drew, at the same weights (before
    the update): mean and max. At round-off when the learner scores the policy that sampled (same
    temperature, same tokens, weights in sync); a temperature the learner ignores shows as a gap of
    order |1/T - 1| times a logit. Rows whose engine reports no log-probs are left out."""
    gaps: list[Tensor] = []
    for row, drawn in enumerate(seqs.sampled_logp):
        if drawn is None or len(drawn) != int(mask[row].sum()):
            continue
        gaps.append((learner_logp[row, : len(drawn)].double().cpu() - torch.tensor(drawn, dtype=torch.float64)).abs())
    if not gaps:
        return {}
    every = torch.cat(gaps)
    return {"sampler_gap/mean": float(every.mean()), "sampler_gap/max": float(every.max())}


def _separate_sft_step(learner: Learner, s: RLSettings, hsft: HSFTBatch, dist: Dist) -> float:
    """The drained batch's own AdamW step at rl.buffer.sft_lr, an SFT update as the SFT stage takes
    it (at SUPERVISED_TEMPERATURE, as the joint mode scores it), in micro-batches like the RL update."""
    policy = learner.policy
    device = next(policy.parameters()).device
    learner.sft_optimizer.zero_grad(set_to_none=True)
    total = 0.0
    if hsft.prompts:
        for rows in micro_batches(hsft.prompts, hsft.targets, s.micro_batch_tokens, scores_whole_rows(policy)):
            with learner.precision.autocast():
                sft_logp, sft_mask, _ = completion_logprobs(
                    policy,
                    [hsft.prompts[r] for r in rows],
                    [hsft.targets[r] for r in rows],
                    learner.pad,
                    temperature=SUPERVISED_TEMPERATURE,
                )
                l_sft = sft_loss(sft_logp, sft_mask, examples_total=len(hsft.prompts))
            l_sft.backward()
            total += l_sft.item()
    else:  # a zero loss that still touches every weight, so the gradient averaging matches
        zero = sum((p.sum() * 0 for p in policy.parameters()), torch.zeros((), device=device))
        zero.backward()
    dist.average_gradients(policy)
    torch.nn.utils.clip_grad_norm_(policy.parameters(), s.max_grad_norm)
    learner.sft_optimizer.step()
    return total


@dataclass(frozen=True)
class StepOutcome:
    """What one step did in this process: steps 1-7's outputs and its timings."""

    sampled: Sampled
    seqs: Sequences
    iml: IMLBatch
    hsft: HSFTBatch
    stats: dict[str, float]  # step 7's losses and diagnostics (this process's share)
    seconds: float
    rollout_seconds: float
    sync: dict[str, float]  # what the weight-sync check measured (rollout.check_synced)


def _process_part(run: RunState, experts: list[int], step: StepOutcome, world: int) -> dict[str, Any]:
    """This process's share of a step's metrics, as plain values: what `step_metrics` gathers."""
    groups, positions = step.sampled.groups, step.seqs.positions
    completions = groups.completions
    ends = [[completions[q][e][r].finished for q, ee, r in positions if ee == e] for e in range(len(experts))]
    part = {
        "rewards": groups.rewards, "correct": groups.correct, "valid": groups.valid,
        "group_sizes": [sum(map(len, c)) for c in completions],
        "tokens": sum(len(completions[q][e][r].token_ids) for q, e, r in positions),
        "finished": sum(completions[q][e][r].finished for q, e, r in positions),
        "prompt_tokens": sum(len(p) for p in step.seqs.prompts),
        "ends": [(sum(x), len(x)) for x in ends],
        "iml_pairs": len(step.iml.pairs),
        "stats": step.stats,
        "sync": step.sync,
    }  # fmt: skip
    if world > 1:  # the replicas and their buffers must stay identical after every step
        part["weights"] = weights_fingerprint(run.learner.policy.named_parameters(), "float64")
        # what each buffer holds, and what it gave to SFT this step (a full buffer empties itself)
        part["buffer"] = [[(h.question_id, h.expert) for h in items] for items in (run.buf.items, step.hsft.drained)]
    return part


def step_metrics(dist: Dist, run: RunState, experts: list[int], step: StepOutcome) -> dict[str, float]:
    """8. One step's metrics over every process's questions, from one gather of each process's
    share. Names: reward/*, accuracy/mean; subgroups/all_wrong (the share of (question, expert)
    subgroups with no correct rollout: where plain GRPO has no gradient) and per expert; iml/pairs;
    hsft/*; completion/* (length, finished share, truncated share per expert); dynamic/*;
    sampler_gap/* (the engine's log-probs against the learner's); sync/* (the weight-sync check: the
    probe's log-prob gap after the push, or the fingerprint's match); perf/* (seconds: the only
    values that differ between identical runs)."""
    parts = dist.gather(_process_part(run, experts, step, dist.world))
    rewards, correct, valid = (torch.cat([p[k] for p in parts]) for k in ("rewards", "correct", "valid"))
    group_sizes = [n for p in parts for n in p["group_sizes"]]
    tokens, finished, prompt_tokens = (sum(p[k] for p in parts) for k in ("tokens", "finished", "prompt_tokens"))
    rollouts = len(step.seqs.positions) * dist.world
    metrics = {"reward/mean": float(rewards[valid].mean()), "accuracy/mean": float(correct[valid].float().mean())}
    # (Q, E) success rate of each subgroup (subgroup sizes differ from question to question)
    success = (correct & valid).sum(-1).float() / valid.sum(-1).clamp(min=1)
    for e, k in enumerate(experts):
        sub = success[:, e]
        metrics[f"reward/expert{k}"] = float(rewards[:, e][valid[:, e]].mean())
        metrics[f"subgroups/all_wrong/expert{k}"] = float((sub == 0).float().mean())
        metrics[f"subgroups/all_correct/expert{k}"] = float((sub == 1).float().mean())
        # the share of the expert's rollouts cut at max_new_tokens (a cut answer scores 0)
        done, total = sum(p["ends"][e][0] for p in parts), sum(p["ends"][e][1] for p in parts)
        metrics[f"completion/truncated/expert{k}"] = 1.0 - done / total if total else 0.0
    question_any = correct.any(-1).any(-1)  # (Q,) some expert solved it
    buf, stats = run.buf, step.stats
    metrics.update(
        {
            "subgroups/all_wrong": float((success == 0).float().mean()),
            "questions/none_correct": float((~question_any).float().mean()),
            "rollouts/sampled": float(step.sampled.rollouts),
            # the rollouts IML and the buffer saw per question (a whole group is in one process)
            "groups/rollouts_min": float(min(group_sizes)),
            "groups/rollouts_max": float(max(group_sizes)),
            "dynamic/replaced": float(step.sampled.replaced),
            "dynamic/rounds": float(step.sampled.rounds),
            "iml/pairs": float(sum(p["iml_pairs"] for p in parts)),
            "hsft/inserted": float(step.hsft.inserted),
            "hsft/buffer_fill": float(len(buf.items)),
            "hsft/flushes": float(buf.flushes),
            "hsft/sft_examples": float(len(step.hsft.drained)),
            "completion/length_mean": tokens / rollouts,
            "prompt/length_mean": prompt_tokens / rollouts,
            "completion/finished_fraction": finished / rollouts,
            "perf/step_seconds": step.seconds,
            "perf/rollout_seconds": step.rollout_seconds,
            "perf/tokens_per_second": tokens / max(step.rollout_seconds, 1e-9),
            "lr": float(run.learner.scheduler.get_last_lr()[0]),
            # a maximum over the processes is their maximum; every other value their mean
            **{k: (max if k.endswith("/max") else statistics.fmean)(p["stats"][k] for p in parts) for k in stats},
            # each process checks its own engine: the worst of them
            **{k: max(p["sync"][k] for p in parts) for k in step.sync},
        }
    )
    if dist.world > 1:
        metrics["dist/processes"] = float(dist.world)
        metrics["dist/replicas_identical"] = float(all(p["weights"] == parts[0]["weights"] for p in parts))
        metrics["dist/buffers_identical"] = float(all(p["buffer"] == parts[0]["buffer"] for p in parts))
    return metrics
