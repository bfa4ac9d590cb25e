"""Steps 4-7 of the RL loop: from scored rollouts to an optimiser step.

4. advantages inside each (question, expert) subgroup, the rollouts flattened to N sequences
5. IML: the pairs' prompts under the best and the worst expert, with the best's rollout
6. HSFT: the experts' failures offered to the buffer; a full buffer becomes an SFT batch
7. `updates_per_batch` optimiser steps on L = L_policy + lambda_iml L_IML + lambda_sft L_SFT
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

# Rows per forward pass in completion_logprobs. One pass over a whole batch pads every row to the
# longest and computes full-vocabulary logits at every prompt and padding position, which only the
# completion positions need. Measured on the toy study's MEF model, 64 rows (prompts
# 60-90 tokens, completions 15-192), forward and backward: one pass 4.1-4.3 s; 32 rows a pass 2.6 s,
# 16 rows 1.7 s, 8 rows 1.5 s (docs/grid.md, "The toy study").
LOGPROB_ROWS = 8


def completion_logprobs(
    model: Any,
    prompts: list[list[int]],
    completions: list[list[int]],
    pad: int,
    with_entropy: bool = False,
    rows_per_pass: int = LOGPROB_ROWS,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Per-token log p of each completion given its prompt.

    Returns logp (N, T), mask (N, T) and, if asked, the entropy of each predicted token (N, T), in
    the rows' own order. Inside, rows are sorted by length and scored `rows_per_pass` at a time,
    each pass right-padded to its longest row and computing logits only from its shortest prompt
    on (`logits_to_keep`): the values of one pass over everything to float32 rounding (not bit for
    bit: the matrix shapes differ), with less padding.
    """
    n, t_max = len(prompts), max(len(c) for c in completions)
    device = next(model.parameters()).device
    order = sorted(range(n), key=lambda row: len(prompts[row]) + len(completions[row]))
    parts: list[tuple[list[int], Tensor, Tensor | None]] = []
    for start in range(0, n, rows_per_pass):
        rows = order[start : start + rows_per_pass]
        logp, entropy = _chunk_logprobs(model, [prompts[r] for r in rows], [completions[r] for r in rows], pad,
                                        t_max, with_entropy, device)  # fmt: skip
        parts.append((rows, logp, entropy))
    back = torch.empty(n, dtype=torch.long)  # the position of each row in the sorted order
    back[torch.tensor([r for rows, _, _ in parts for r in rows])] = torch.arange(n)
    back = back.to(device)
    logp = torch.cat([lp for _, lp, _ in parts])[back]
    entropy = torch.cat([e for _, _, e in parts if e is not None])[back] if with_entropy else None
    mask = torch.zeros((n, t_max), dtype=torch.bool)
    for row, c in enumerate(completions):
        mask[row, : len(c)] = True
    return logp, mask.to(device), entropy


def _chunk_logprobs(
    model: Any,
    prompts: list[list[int]],
    completions: list[list[int]],
    pad: int,
    t_max: int,
    with_entropy: bool,
    device: Any,
) -> tuple[Tensor, Tensor | None]:
    """One right-padded forward pass over a few rows -> logp (n, t_max), entropy (n, t_max) or None,
    zero past each completion."""
    width = max(len(p) + len(c) for p, c in zip(prompts, completions, strict=True))
    t_pass = max(len(c) for c in completions)  # this pass's longest completion; zeros fill up to t_max
    # the logits at position i predict token i + 1: completion token j sits at len(p) + j, so only
    # the positions from the shortest prompt's last token on are needed
    first = min(len(p) for p in prompts) - 1
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    index = torch.zeros((len(prompts), t_pass), dtype=torch.long)
    targets = torch.zeros((len(prompts), t_pass), dtype=torch.long)
    mask = torch.zeros((len(prompts), t_pass), dtype=torch.bool)
    for row, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids[row, : len(p) + len(c)] = torch.tensor(p + c)
        attention[row, : len(p) + len(c)] = 1
        index[row, : len(c)] = torch.arange(len(p) - 1 - first, len(p) - 1 - first + len(c))
        targets[row, : len(c)] = torch.tensor(c)
        mask[row, : len(c)] = True
    keep = width - first
    logits = model(input_ids=ids.to(device), attention_mask=attention.to(device), logits_to_keep=keep).logits.float()
    picked = logits.gather(1, index.to(device)[..., None].expand(-1, -1, logits.shape[-1]))  # (n, T, V)
    log_probs = torch.log_softmax(picked, dim=-1)
    logp = log_probs.gather(-1, targets.to(device)[..., None]).squeeze(-1) * mask.to(device)
    entropy = -(log_probs.exp() * log_probs).sum(-1) * mask.to(device) if with_entropy else None
    fill = (0, t_max - t_pass)
    return torch.nn.functional.pad(logp, fill), None if entropy is None else torch.nn.functional.pad(entropy, fill)


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
    """Step 5's output: for each pair, the best expert's rollout under both experts' prompts."""

    pairs: list[Any]
    strong: list[list[int]] = field(default_factory=list)  # the prompt under the best expert
    weak: list[list[int]] = field(default_factory=list)  # the same question under the worst
    tokens: list[list[int]] = field(default_factory=list)  # O+, a correct rollout of the best


def iml_step(groups: Groups, enabled: bool, tie_break: random.Random) -> IMLBatch:
    """5. Best and worst expert per question (whole groups: one process each)."""
    if not enabled:
        return IMLBatch([])
    pairs = iml_pairs(groups.rewards, groups.correct, groups.valid, tie_break)
    return IMLBatch(
        pairs,
        [groups.prompt[p.question][p.best] for p in pairs],
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
    for update in range(s.updates_per_batch):
        with precision.autocast():
            logp, mask, entropy = completion_logprobs(policy, seqs.prompts, seqs.completions, pad, with_entropy=True)
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
                with torch.no_grad():  # L_IML stops the strong side's gradient: no graph for it
                    strong, iml_mask, _ = completion_logprobs(policy, iml.strong, iml.tokens, pad)
                weak, _, _ = completion_logprobs(policy, iml.weak, iml.tokens, pad)
                l_iml = iml_loss(strong, weak, iml_mask)
                loss = loss + s.lambda_iml * l_iml
            l_sft = torch.zeros((), device=loss.device)
            if sft.prompts and update == 0 and s.buffer.update == "joint":
                sft_logp, sft_mask, _ = completion_logprobs(policy, sft.prompts, sft.targets, pad)
                l_sft = sft_loss(sft_logp, sft_mask)
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
