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

Under `accelerate launch` (distributed.py) each process runs this loop on its block of whole
questions (Q / processes), so steps 4-6 see complete groups; offers to the buffer are gathered,
gradients averaged, metrics gathered, and the main process alone writes. After each update the
rollout engine's weights are synced and checked (rollout.check_synced). Precision: precision.py.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from meml.core.answers import RewardConfig, score
from meml.core.io import DataError, atomic_write_json, locked
from meml.core.precision import Precision, resolve
from meml.core.records import Record, read_records
from meml.core.stops import stop_tokens, target_ids
from meml.core.tracking import Tracker, read_metrics
from meml.data.experts import DEFAULT_PROMPTS, chat_messages, read_trajectories
from meml.plan.grid import rollouts_per_expert
from meml.training import checkpoint
from meml.training.buffer import HardExample, HardExampleBuffer
from meml.training.distributed import Dist
from meml.training.engines import make_engine
from meml.training.lengths import check_fits, over_cap_shares
from meml.training.losses import iml_loss, iml_pairs, policy_loss, sft_loss, subgroup_advantages
from meml.training.rl_settings import RLSettings
from meml.training.rollout import Completion, RolloutEngine, Sampling, check_synced, prompt_ids, weights_fingerprint


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


class QuestionOrder:
    """Questions in a seeded random order, a new permutation each epoch; resumable by its state."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch, self.position = n, seed, 0, 0
        self._perm = self._permutation()

    def _permutation(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def take(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            if self.position == self.n:
                self.epoch, self.position = self.epoch + 1, 0
                self._perm = self._permutation()
            out.append(self._perm[self.position])
            self.position += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self._perm = self._permutation()


@dataclass
class Groups:
    """The rollouts of Q questions by E experts: prompt [Q][E] and completions [Q][E][n_e] (token
    ids), with rewards, correct and valid as (Q, E, R) tensors (R = the largest n_e; valid marks
    the slots that hold a rollout)."""

    records: list[Record]
    prompt: list[list[list[int]]]
    completions: list[list[list[Completion]]]
    rewards: Tensor
    correct: Tensor
    valid: Tensor

    def informative(self) -> Tensor:
        """(Q,) True where some (question, expert) subgroup has rewards that differ: a gradient."""
        high = self.rewards.masked_fill(~self.valid, float("-inf")).amax(-1)
        low = self.rewards.masked_fill(~self.valid, float("inf")).amin(-1)
        return ((high > low) & self.valid.any(-1)).any(-1)

    def replace(self, rows: list[int], fresh: Groups) -> None:
        """Put fresh's questions into the given rows (dynamic sampling)."""
        for i, q in enumerate(rows):
            self.records[q], self.prompt[q], self.completions[q] = (
                fresh.records[i],
                fresh.prompt[i],
                fresh.completions[i],
            )
            self.rewards[q], self.correct[q], self.valid[q] = fresh.rewards[i], fresh.correct[i], fresh.valid[i]


def sample_groups(
    engine: RolloutEngine,
    tokenizer: Any,
    batch: list[Record],
    experts: list[int],
    counts: list[int],
    sampling: Sampling,
    prompts: tuple[str, ...] | list[str],
    reward_config: RewardConfig,
) -> Groups:
    """Steps 2 and 3 of the loop: every expert's rollouts for every question, in one engine call
    (each (question, expert) prompt with its expert's rollout count), scored by the checker."""
    Q, E, R = len(batch), len(experts), max(counts)
    prompt = [[prompt_ids(tokenizer, chat_messages(r, k, prompts)) for k in experts] for r in batch]  # [Q][E]
    sampled = engine.generate([prompt[q][e] for q in range(Q) for e in range(E)], counts * Q, sampling)
    completions = [[sampled[q * E + e] for e in range(E)] for q in range(Q)]
    rewards = torch.zeros(Q, E, R)
    correct = torch.zeros(Q, E, R, dtype=torch.bool)
    valid = torch.zeros(Q, E, R, dtype=torch.bool)
    for q, record in enumerate(batch):
        for e in range(E):
            for r, c in enumerate(completions[q][e]):
                ok, value = score(c.text, record.dataset, record.answer, record.options, reward_config)
                correct[q, e, r], valid[q, e, r], rewards[q, e, r] = ok, True, value
    return Groups(list(batch), prompt, completions, rewards, correct, valid)


def completion_logprobs(
    model: Any, prompts: list[list[int]], completions: list[list[int]], pad: int, with_entropy: bool = False
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Per-token log p of each completion given its prompt, one right-padded forward pass.

    Returns logp (N, T), mask (N, T) and, if asked, the entropy of each predicted token (N, T).
    """
    lengths = [len(p) + len(c) for p, c in zip(prompts, completions, strict=True)]
    width, t_max = max(lengths), max(len(c) for c in completions)
    device = next(model.parameters()).device
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    index = torch.zeros((len(prompts), t_max), dtype=torch.long)
    mask = torch.zeros((len(prompts), t_max), dtype=torch.bool)
    for row, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids[row, : len(p) + len(c)] = torch.tensor(p + c)
        attention[row, : len(p) + len(c)] = 1
        # logits at position t predict token t + 1: completion token j sits at len(p) + j
        index[row, : len(c)] = torch.arange(len(p) - 1, len(p) - 1 + len(c))
        mask[row, : len(c)] = True
    logits = model(input_ids=ids.to(device), attention_mask=attention.to(device)).logits.float()
    picked = logits.gather(1, index.to(device)[..., None].expand(-1, -1, logits.shape[-1]))  # (N, T, V)
    log_probs = torch.log_softmax(picked, dim=-1)
    targets = torch.zeros_like(index)
    for row, c in enumerate(completions):
        targets[row, : len(c)] = torch.tensor(c)
    logp = log_probs.gather(-1, targets.to(device)[..., None]).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1) if with_entropy else None
    return logp * mask.to(device), mask.to(device), entropy


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
    from transformers import AutoModelForCausalLM, AutoTokenizer

    precision = precision or resolve("cpu")
    dist = Dist.from_env(precision.device)
    out = Path(out_dir)
    if _same_params(out, params) and (out / "DONE").is_file():
        return dict(json.loads((out / "DONE").read_text()))
    # everything that can fail is set up and checked before an old run in the folder is touched
    s = RLSettings.from_config(settings)  # every key read here, once
    Q, G = s.questions_per_step, s.group_size
    experts = list(method.rl_experts)
    counts = rollouts_per_expert(G, len(experts), s.spread)
    E = len(experts)  # tensors below are (Q, E, R) with R = max(counts) rollout slots
    sampling = s.sampling
    reward_config = RewardConfig(reward_mode, format_bonus)

    # ---------------------------------------------------------------- setup
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # fp32 master weights in every precision; bf16 runs compute under autocast (precision.py)
    device = torch.device(dist.device)
    policy: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    policy.to(device)
    if precision.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
    policy.train()
    reference: Any = None
    if s.beta > 0:
        reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=precision.torch_dtype())
        reference.to(device).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=s.lr, weight_decay=0.0)
    # HSFT's reading (rl.buffer.update): `joint` adds lambda_sft * L_SFT to the RL step's loss;
    # `separate` takes its own optimiser step on the drained batch at rl.buffer.sft_lr
    hsft_update = s.buffer.update
    sft_optimizer = torch.optim.AdamW(policy.parameters(), lr=s.buffer.sft_lr, weight_decay=0.0)
    warmup = max(1, s.warmup_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / warmup))
    engine = engine or make_engine(s.engine, policy, model_dir, tokenizer, settings, precision, seed, dist.rank)
    records = read_records(Path(data_dir) / "train.jsonl")
    by_id = {r.id: r for r in records}
    over_cap = over_cap_shares(tokenizer, experts_dir, experts, by_id, s.max_new_tokens)
    check_fits(over_cap, s.max_new_tokens, s.max_truncated_share, experts_dir)
    solutions = _hsft_solutions(s.buffer.solution, records, experts_dir)
    buf = HardExampleBuffer(s.buffer.capacity, s.buffer.threshold, s.buffer.insert_prob, seed)
    order = QuestionOrder(len(records), seed)  # the same order in every process
    stops, pad = stop_tokens(tokenizer), tokenizer.pad_token_id  # a turn ends with stops.end_of_turn
    # the RL budget: rl.steps, or rl.epochs passes over this data set's training questions
    steps = s.steps if s.epochs is None else math.ceil(s.epochs * len(records) / Q)

    # ---------------------------------------------------------------- only now touch the folder
    if dist.is_main:
        newest = checkpoint.newest_marked(out / "checkpoints")  # no checksum needed to read its step
        if not _same_params(out, params):
            _move_aside(out, "the cell's values changed", mlflow_settings)
        elif newest is not None and checkpoint.step_of(newest) >= steps and not (out / "DONE").is_file():
            # a finished run whose DONE was removed (snakemake --forcerun): train it again
            _move_aside(out, "its DONE marker was removed (a forced rerun)", mlflow_settings)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / "cell.json", params or {})
    dist.barrier()

    start = 0
    last = checkpoint.latest(out / "checkpoints")
    if last is not None:
        state = checkpoint.load(last)
        policy.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        order.load_state_dict(state["order"])
        buf.load_state_dict(state["buffer"])
        sft_optimizer.load_state_dict(state["sft_optimizer"])
        rngs = state["rng"] if isinstance(state["rng"], list) else [state["rng"]]
        if len(rngs) != dist.world:
            raise DataError(f"checkpoint of {len(rngs)} process(es) cannot resume in {dist.world}", last)
        checkpoint.set_rng_state(rngs[dist.rank])
        start = int(state["step"])
    elif dist.rank > 0:
        torch.manual_seed(seed + 7919 * dist.rank)  # each process samples its own rollouts
    engine.sync_weights(policy)
    check_synced(engine, policy)
    tracker = (
        Tracker(
            out,
            cell_key or method.name,
            mlflow_params or params or {},
            mlflow_settings,
            resume_from_step=start,
            tags=mlflow_tags,
        )
        if dist.is_main
        else None
    )

    shown = progress and dist.is_main
    bar = tqdm(range(start, steps), desc=f"RL {method.name}", initial=start, total=steps, disable=not shown)
    for step in bar:
        t0 = time.time()
        # ------------------------------------------------------------ 1. questions (this process's block)
        batch: list[Record] = dist.block([records[i] for i in order.take(Q)])
        Qp = len(batch)  # Q / processes

        # ------------------------------------------------------------ 2.-3. rollouts and rewards  (Qp, E, R)
        groups = sample_groups(engine, tokenizer, batch, experts, counts, sampling, prompts, reward_config)
        sampled_rollouts, replaced, rounds = Q * sum(counts), 0, 0
        while rounds < method.dynamic_sampling:  # the DAPO-style baseline only
            informative = groups.informative()  # (Qp,) some subgroup with a reward spread
            dead = [q for q in range(Qp) if not informative[q]]
            dead_counts = dist.gather(len(dead))  # fresh questions come from the shared order
            if sum(dead_counts) == 0:
                break
            rounds += 1
            fresh_all = [records[i] for i in order.take(sum(dead_counts))]
            mine = sum(dead_counts[: dist.rank])
            if dead:
                fresh = fresh_all[mine : mine + len(dead)]
                groups.replace(
                    dead, sample_groups(engine, tokenizer, fresh, experts, counts, sampling, prompts, reward_config)
                )
            sampled_rollouts += sum(dead_counts) * sum(counts)
            replaced += sum(dead_counts)
        batch, prompt, completions = groups.records, groups.prompt, groups.completions
        rewards, correct, valid = groups.rewards, groups.correct, groups.valid
        rollout_seconds = time.time() - t0

        # ------------------------------------------------------------ 4. advantages  (Qp, E, R)
        advantages = subgroup_advantages(rewards, valid, method.advantage)

        # flatten the valid rollouts into N sequences
        cells = [(q, e, r) for q in range(Qp) for e in range(E) for r in range(counts[e])]
        seq_prompts = [prompt[q][e] for q, e, _ in cells]
        seq_completions = [completions[q][e][r].token_ids or [stops.end_of_turn] for q, e, r in cells]
        seq_adv = torch.tensor([float(advantages[q, e, r]) for q, e, r in cells])

        # ------------------------------------------------------------ 5. IML pairs (whole groups: one process each)
        tie_break = random.Random(f"iml-{seed}-{step}-{dist.rank}")  # seeded per step: a resume draws the same
        pairs = iml_pairs(rewards, correct, valid, tie_break) if method.iml else []
        iml_strong = [prompt[p.question][p.best] for p in pairs]
        iml_weak = [prompt[p.question][p.worst] for p in pairs]
        iml_tokens = [completions[p.question][p.best][p.rollout].token_ids for p in pairs]

        # ------------------------------------------------------------ 6. HSFT buffer (identical in every process)
        inserted, drained, sft_batch = 0, [], []
        if method.hsft:
            offers = [  # (question, expert, failures, rollouts): counts, so the threshold is exact
                (record.id, k, counts[e] - int(correct[q, e, : counts[e]].sum()), counts[e])
                for q, record in enumerate(batch)
                for e, k in enumerate(experts)
            ]
            for question_id, k, failures, n in [o for part in dist.gather(offers) for o in part]:
                inserted += buf.offer(HardExample(question_id, k), failures, n)
            if buf.full:
                drained = buf.drain()
                sft_batch = drained[dist.rank :: dist.world]
        sft_prompts = [prompt_ids(tokenizer, chat_messages(by_id[h.question_id], h.expert, prompts)) for h in sft_batch]
        sft_targets = [target_ids(tokenizer, solutions(h), stops) for h in sft_batch]

        # ------------------------------------------------------------ 7. updates
        old_logp = None
        ref_logp = None
        with torch.no_grad(), precision.autocast():
            if s.updates_per_batch > 1:
                old_logp, _, _ = completion_logprobs(policy, seq_prompts, seq_completions, pad)
            if reference is not None:
                ref_logp, _, _ = completion_logprobs(reference, seq_prompts, seq_completions, pad)
        stats: dict[str, float] = {}
        for update in range(s.updates_per_batch):
            with precision.autocast():
                logp, mask, entropy = completion_logprobs(policy, seq_prompts, seq_completions, pad, with_entropy=True)
                pl = policy_loss(
                    logp,
                    logp.detach() if old_logp is None else old_logp,
                    seq_adv.to(logp.device),
                    mask,
                    method.advantage,
                    s.clip_eps,
                    s.max_new_tokens,
                    ref_logp,
                    s.beta,
                )
                loss = pl.loss
                l_iml = torch.zeros((), device=loss.device)
                if pairs:
                    strong, iml_mask, _ = completion_logprobs(policy, iml_strong, iml_tokens, pad)
                    weak, _, _ = completion_logprobs(policy, iml_weak, iml_tokens, pad)
                    l_iml = iml_loss(strong, weak, iml_mask)
                    loss = loss + s.lambda_iml * l_iml
                l_sft = torch.zeros((), device=loss.device)
                if sft_batch and update == 0 and hsft_update == "joint":
                    sft_logp, sft_mask, _ = completion_logprobs(policy, sft_prompts, sft_targets, pad)
                    l_sft = sft_loss(sft_logp, sft_mask)
                    loss = loss + s.lambda_sft * l_sft
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            dist.average_gradients(policy)  # the replicas take the same step
            grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), s.max_grad_norm)
            optimizer.step()
            scheduler.step()
            if update == 0:
                assert entropy is not None
                stats = {
                    "loss/policy": pl.loss.item(),
                    "loss/total": loss.item(),
                    "loss/iml": l_iml.item(),
                    "loss/sft": l_sft.item(),
                    "kl": pl.kl,
                    "clip_fraction": pl.clip_fraction,
                    "entropy": float((entropy.detach() * mask).sum() / mask.sum()),
                    "grad_norm": float(grad_norm),
                }
        if drained and hsft_update == "separate":  # every process steps (its share may be empty)
            with precision.autocast():
                if sft_batch:
                    sft_logp, sft_mask, _ = completion_logprobs(policy, sft_prompts, sft_targets, pad)
                    l_sft = sft_loss(sft_logp, sft_mask)
                else:
                    l_sft = sum((p.sum() * 0 for p in policy.parameters()), torch.zeros((), device=device))
            sft_optimizer.zero_grad(set_to_none=True)
            l_sft.backward()
            dist.average_gradients(policy)
            torch.nn.utils.clip_grad_norm_(policy.parameters(), s.max_grad_norm)
            sft_optimizer.step()
            stats["loss/sft"] = l_sft.item()
        engine.sync_weights(policy)
        check_synced(engine, policy)  # a stale engine would sample from old weights without a sound

        # ------------------------------------------------------------ 8. metrics (over every process's questions)
        seconds = time.time() - t0
        rewards, correct, valid = (torch.cat(dist.gather(t)) for t in (rewards, correct, valid))  # (Q, E, R)
        group_sizes = [n for part in dist.gather([sum(map(len, completions[q])) for q in range(Qp)]) for n in part]
        tokens = sum(dist.gather(sum(len(completions[q][e][r].token_ids) for q, e, r in cells)))
        finished = sum(dist.gather(sum(completions[q][e][r].finished for q, e, r in cells)))
        n_pairs = sum(dist.gather(len(pairs)))
        per_process = dist.gather(stats)  # losses of each process's share, averaged
        stats = {k: statistics.fmean(p[k] for p in per_process) for k in stats}
        metrics = {"reward/mean": float(rewards[valid].mean()), "accuracy/mean": float(correct[valid].float().mean())}
        for e, k in enumerate(experts):
            sub = correct[:, e, : counts[e]].float().mean(-1)  # (Q,) success rate of each subgroup
            metrics[f"reward/expert{k}"] = float(rewards[:, e, : counts[e]].mean())
            metrics[f"subgroups/all_wrong/expert{k}"] = float((sub == 0).float().mean())
            metrics[f"subgroups/all_correct/expert{k}"] = float((sub == 1).float().mean())
            # the share of the expert's rollouts cut at max_new_tokens (a cut answer scores 0)
            ends = [completions[q][e][r].finished for q, ee, r in cells if ee == e]
            done, total = sum(dist.gather(sum(ends))), sum(dist.gather(len(ends)))
            metrics[f"completion/truncated/expert{k}"] = 1.0 - done / total if total else 0.0
        question_any = correct.any(-1).any(-1)  # (Q,) some expert solved it
        metrics.update(
            {
                "subgroups/all_wrong": float(
                    torch.stack([(correct[:, e, : counts[e]].float().mean(-1) == 0) for e in range(E)]).float().mean()
                ),
                "questions/none_correct": float((~question_any).float().mean()),
                "rollouts/sampled": float(sampled_rollouts),
                # the rollouts IML and the buffer saw per question: G for every question (one process each)
                "groups/rollouts_min": float(min(group_sizes)),
                "groups/rollouts_max": float(max(group_sizes)),
                "dynamic/replaced": float(replaced),
                "dynamic/rounds": float(rounds),
                "iml/pairs": float(n_pairs),
                "hsft/inserted": float(inserted),
                "hsft/buffer_fill": float(len(buf.items)),
                "hsft/flushes": float(buf.flushes),
                "hsft/sft_examples": float(len(drained)),
                "completion/length_mean": tokens / (len(cells) * dist.world),
                "prompt/length_mean": statistics.fmean(len(p) for p in seq_prompts),
                "completion/finished_fraction": finished / (len(cells) * dist.world),
                "perf/step_seconds": seconds,
                "perf/rollout_seconds": rollout_seconds,
                "perf/tokens_per_second": tokens / max(rollout_seconds, 1e-9),
                "lr": float(scheduler.get_last_lr()[0]),
                **stats,
            }
        )
        if dist.world > 1:  # the replicas and their buffers must stay identical after every step
            prints = dist.gather(weights_fingerprint(policy.named_parameters(), "float64", every=True))
            # what each buffer holds, and what it gave to SFT this step (a full buffer empties itself)
            buffers = dist.gather([[(h.question_id, h.expert) for h in part] for part in (buf.items, drained)])
            metrics["dist/processes"] = float(dist.world)
            metrics["dist/replicas_identical"] = float(all(p == prints[0] for p in prints))
            metrics["dist/buffers_identical"] = float(all(b == buffers[0] for b in buffers))
        if tracker is not None:
            tracker.log(step, metrics)
        bar.set_postfix(reward=f"{metrics['reward/mean']:.2f}", all_wrong=f"{metrics['subgroups/all_wrong']:.2f}")

        # ------------------------------------------------------------ checkpoint (the main process writes)
        done_steps = step + 1
        if done_steps % s.checkpoint_every == 0 or done_steps == steps:
            rngs = dist.gather(checkpoint.rng_state())
            if dist.is_main:
                checkpoint.save(
                    out / "checkpoints",
                    done_steps,
                    {
                        "step": done_steps,
                        "model": policy.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "sft_optimizer": sft_optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(),
                        "order": order.state_dict(),
                        "buffer": buf.state_dict(),
                        "rng": rngs,  # one state per process
                    },
                )
                assert tracker is not None
                tracker.commit()  # these steps' metrics reach MLflow once their checkpoint exists
            dist.barrier()
        if stop_after is not None and done_steps >= stop_after and done_steps < steps:
            if tracker is not None:
                tracker.close("KILLED")
            raise KeyboardInterrupt(f"stopped after step {done_steps} (simulated kill)")

    # ---------------------------------------------------------------- final model and summary
    if dist.is_main:
        from meml.data.tiny_models import save_atomically

        assert tracker is not None
        save_atomically(out / "model", tokenizer, policy)
        lines = read_metrics(out / "metrics.jsonl")
        summary = {
            "method": method.name,
            "steps": steps,
            "processes": dist.world,
            "precision": precision.dtype,
            "trajectories_over_max_new_tokens": over_cap,
            "final": lines[-1] if lines else {},
            "reward_first": lines[0]["reward/mean"] if lines else None,
            "reward_last": lines[-1]["reward/mean"] if lines else None,
            "mlflow_run_id": tracker.run_id,
        }
        tracker.log_artifact(out / "metrics.jsonl")
        tracker.log_artifact(out / "cell.json")  # the values that define the cell
        tracker.close()
        atomic_write_json(out / "DONE", summary)
    dist.barrier()
    return dict(json.loads((out / "DONE").read_text()))


RUN_FILES = ("checkpoints", "model", "metrics.jsonl", "DONE", "mlflow_run_id", "cell.json")


def _move_aside(out: Path, why: str, mlflow_settings: dict[str, Any] | None) -> None:
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


def _same_params(out: Path, params: dict[str, Any] | None) -> bool:
    """True when out/cell.json holds these params, or when neither exists (nothing to compare)."""
    path = out / "cell.json"
    if not path.is_file():
        return not (out / "checkpoints").exists()
    return bool(json.loads(path.read_text()) == json.loads(json.dumps(params or {})))


def _hsft_solutions(source: str, records: list[Record], experts_dir: str | Path) -> Any:
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
