"""Steps 4-7 of the RL loop: from scored rollouts to an optimiser step.

4. advantages inside each (question, expert) subgroup, the rollouts flattened to N sequences
5. IML: the pairs' prompts under the worst expert, with the best's rollout
6. HSFT: the experts' failures offered to the buffer; a full buffer becomes an SFT batch
7. `updates_per_batch` optimiser steps on L = L_policy + lambda_iml L_IML + lambda_sft L_SFT, every
   row that takes a gradient scored in one call (scoring.py: each distinct prompt once)
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from meml.core.precision import Precision
from meml.core.records import Record
from meml.core.stops import target_ids
from meml.data.experts import chat_messages
from meml.training.buffer import HardExample, HardExampleBuffer
from meml.training.distributed import Dist
from meml.training.groups import Groups
from meml.training.losses import iml_loss, iml_pairs, policy_loss, sft_loss, subgroup_advantages
from meml.training.rl_settings import RLSettings
from meml.training.rollout import prompt_ids
from meml.training.scoring import completion_logprobs


@dataclass(frozen=True)
class Sequences:
    """Step 4's output: the N valid rollouts, flattened in (question, expert, rollout) order."""

    cells: list[tuple[int, int, int]]  # (q, e, r) of each sequence
    prompts: list[list[int]]
    completions: list[list[int]]
    advantages: Tensor  # (N,)


def advantages_step(groups: Groups, counts: list[int], advantage: str, end_of_turn: int) -> Sequences:
    """4. Advantages inside each (question, expert) subgroup (Q, E, R), flattened to N sequences
    (an empty completion is scored as the end-of-turn token alone)."""
    advantages = subgroup_advantages(groups.rewards, groups.valid, advantage)  # (Q, E, R)
    Q, E = len(groups.records), len(counts)
    cells = [(q, e, r) for q in range(Q) for e in range(E) for r in range(counts[e])]
    return Sequences(
        cells,
        [groups.prompt[q][e] for q, e, _ in cells],
        [groups.completions[q][e][r].token_ids or [end_of_turn] for q, e, r in cells],
        torch.tensor([float(advantages[q, e, r]) for q, e, r in cells]),
    )


@dataclass(frozen=True)
class IMLBatch:
    """Step 5's output: for each pair, the worst expert's prompt and the best expert's rollout (its
    score under the best expert's own prompt is its row of the policy pass)."""

    pairs: list[Any]
    weak: list[list[int]] = field(default_factory=list)  # the same question under the worst
    tokens: list[list[int]] = field(default_factory=list)  # O+, a correct rollout of the best


def iml_step(groups: Groups, enabled: bool, tie_break: random.Random) -> IMLBatch:
    """5. Best and worst expert per question (whole groups: one process each)."""
    if not enabled:
        return IMLBatch([])
    pairs = iml_pairs(groups.rewards, groups.correct, groups.valid, tie_break)
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


def hsft_step(
    buf: HardExampleBuffer,
    groups: Groups,
    experts: list[int],
    counts: list[int],
    dist: Dist,
    by_id: dict[str, Record],
    solution: Any,
    tokenizer: Any,
    prompts: tuple[str, ...] | list[str],
    stops: Any,
) -> HSFTBatch:
    """6. Each expert failing a question more often than K/G offers it (counts, so the threshold is
    exact); every process offers all processes' questions, so the buffers stay identical. A full
    buffer is drained into an SFT batch, shared among the processes."""
    offers = [  # (question, expert, failures, rollouts)
        (record.id, k, counts[e] - int(groups.correct[q, e, : counts[e]].sum()), counts[e])
        for q, record in enumerate(groups.records)
        for e, k in enumerate(experts)
    ]
    inserted = 0
    for question_id, k, failures, n in [o for part in dist.gather(offers) for o in part]:
        inserted += buf.offer(HardExample(question_id, k), failures, n)
    if not buf.full:
        return HSFTBatch(inserted)
    drained = buf.drain()
    mine = drained[dist.rank :: dist.world]
    return HSFTBatch(
        inserted,
        drained,
        [prompt_ids(tokenizer, chat_messages(by_id[h.question_id], h.expert, prompts)) for h in mine],
        [target_ids(tokenizer, solution(h), stops) for h in mine],
    )


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


def update_step(
    learner: Learner, s: RLSettings, advantage: str, seqs: Sequences, iml: IMLBatch, sft: HSFTBatch, dist: Dist
) -> dict[str, float]:
    """7. `updates_per_batch` optimiser steps on L = L_policy + lambda_iml L_IML + lambda_sft L_SFT
    (L_SFT on the first update only, under rl.buffer.update: joint); under `separate` the drained
    batch takes its own step at rl.buffer.sft_lr. Returns the first update's losses."""
    policy, pad, precision = learner.policy, learner.pad, learner.precision
    old_logp = ref_logp = None
    with torch.no_grad(), precision.autocast():
        if s.updates_per_batch > 1:
            old_logp, _, _ = completion_logprobs(policy, seqs.prompts, seqs.completions, pad)
        if learner.reference is not None:
            ref_logp, _, _ = completion_logprobs(learner.reference, seqs.prompts, seqs.completions, pad)
    stats: dict[str, float] = {}
    n = len(seqs.prompts)
    strong_rows = [seqs.cells.index((p.question, p.best, p.rollout)) for p in iml.pairs]  # O+ is a policy row
    for update in range(s.updates_per_batch):
        with precision.autocast():
            # one scoring call for every row that takes a gradient: the policy's rollouts, then
            # O+ under the worst expert's prompt (IML), then the drained buffer (HSFT, first update
            # only); each distinct prompt runs once (scoring.py)
            with_sft = bool(sft.prompts) and update == 0 and s.buffer.update == "joint"
            prompts = seqs.prompts + iml.weak + (sft.prompts if with_sft else [])
            targets = seqs.completions + iml.tokens + (sft.targets if with_sft else [])
            all_logp, all_mask, all_entropy = completion_logprobs(policy, prompts, targets, pad, with_entropy=True)
            t_policy = max(len(c) for c in seqs.completions)
            logp, mask = all_logp[:n, :t_policy], all_mask[:n, :t_policy]
            assert all_entropy is not None
            entropy = all_entropy[:n, :t_policy]
            pl = policy_loss(
                logp,
                logp.detach() if old_logp is None else old_logp,
                seqs.advantages.to(logp.device),
                mask,
                advantage,
                s.clip_eps,
                s.max_new_tokens,
                ref_logp,
                s.beta,
            )
            loss = pl.loss
            l_iml = torch.zeros((), device=loss.device)
            if iml.pairs:
                # the strong side, log p(O+ | Q, P_best), is O+'s own row of the policy pass (the
                # same weights; the loss stops its gradient)
                m = len(iml.pairs)
                weak, iml_mask = all_logp[n : n + m], all_mask[n : n + m]
                strong = torch.zeros_like(weak)
                for i, row in enumerate(strong_rows):
                    length = len(iml.tokens[i])
                    assert seqs.completions[row] == iml.tokens[i]  # the same tokens, scored under P_best
                    strong[i, :length] = all_logp[row, :length]
                l_iml = iml_loss(strong, weak, iml_mask)
                loss = loss + s.lambda_iml * l_iml
            l_sft = torch.zeros((), device=loss.device)
            if with_sft:
                start = n + len(iml.pairs)
                l_sft = sft_loss(all_logp[start:], all_mask[start:])
                loss = loss + s.lambda_sft * l_sft
        learner.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        dist.average_gradients(policy)  # the replicas take the same step
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), s.max_grad_norm)
        learner.optimizer.step()
        learner.scheduler.step()
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
    if sft.drained and s.buffer.update == "separate":  # every process steps (its share may be empty)
        stats["loss/sft"] = _separate_sft_step(learner, s, sft, dist)
    return stats


def _separate_sft_step(learner: Learner, s: RLSettings, sft: HSFTBatch, dist: Dist) -> float:
    policy = learner.policy
    with learner.precision.autocast():
        if sft.prompts:
            sft_logp, sft_mask, _ = completion_logprobs(policy, sft.prompts, sft.targets, learner.pad)
            l_sft = sft_loss(sft_logp, sft_mask)
        else:  # a zero loss that still touches every weight, so the gradient averaging matches
            device = next(policy.parameters()).device
            l_sft = sum((p.sum() * 0 for p in policy.parameters()), torch.zeros((), device=device))
    learner.sft_optimizer.zero_grad(set_to_none=True)
    l_sft.backward()
    dist.average_gradients(policy)
    torch.nn.utils.clip_grad_norm_(policy.parameters(), s.max_grad_norm)
    learner.sft_optimizer.step()
    return float(l_sft.item())
