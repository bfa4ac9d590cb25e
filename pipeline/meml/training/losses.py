"""Every formula of the RL stage in one place: advantages, the clipped policy loss (GRPO and
Dr.GRPO aggregation), the KL penalty, inter-expert mutual learning (IML) and the SFT term.

Shapes: Q questions, E experts, R rollouts per expert (ragged rollouts padded, `valid` marks the
real ones), N = flattened sequences, T = completion tokens (padded, `mask` marks real tokens).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from fractions import Fraction

import torch
from torch import Tensor

ADVANTAGES = ("grpo", "drgrpo")


def subgroup_advantages(rewards: Tensor, valid: Tensor, kind: str) -> Tensor:
    """Advantage of every rollout within its (question, expert) subgroup. rewards, valid: (Q, E, R).

    grpo:   A = (r - mean) / std  (std unbiased, as torch.std)
    drgrpo: A = r - mean          (no division by the std)
    A subgroup whose rewards are all equal, or that has one rollout, gets A = 0 exactly, for both.
    "All equal" is decided on the rewards themselves (max == min), never on a rounded mean or std:
    in float32 the mean of eight rewards of 1.2 is not 1.2, and (r - mean) / std of such a group
    comes out near +-0.9 instead of 0.
    """
    if kind not in ADVANTAGES:
        raise ValueError(f"unknown advantage '{kind}'; known: {', '.join(ADVANTAGES)}")
    valid_f = valid.to(rewards.dtype)
    n = valid_f.sum(-1, keepdim=True)
    high = rewards.masked_fill(~valid, float("-inf")).amax(-1, keepdim=True)
    low = rewards.masked_fill(~valid, float("inf")).amin(-1, keepdim=True)
    flat = (high == low) | (n < 2)  # (Q, E, 1): no spread, no signal
    mean = (rewards * valid_f).sum(-1, keepdim=True) / n.clamp(min=1)
    centered = torch.where(flat, torch.zeros_like(rewards), (rewards - mean) * valid_f)
    if kind == "drgrpo":
        return centered
    std = ((centered**2).sum(-1, keepdim=True) / (n - 1).clamp(min=1)).sqrt()
    return torch.where(flat, torch.zeros_like(centered), centered / torch.where(flat, torch.ones_like(std), std))


@dataclass
class PolicyLossOut:
    loss: Tensor
    clipped: float  # tokens whose ratio the clip holds back (on the side the advantage pushes)
    tokens: float  # real (unmasked) tokens
    kl_sum: float  # sum of the k3 KL estimate over the tokens (0 without a reference)

    @property
    def clip_fraction(self) -> float:
        return self.clipped / max(self.tokens, 1.0)

    @property
    def kl(self) -> float:
        return self.kl_sum / max(self.tokens, 1.0)


@dataclass(frozen=True)
class PolicyBatch:
    """The rows a policy loss is taken on."""

    logp: Tensor  # (N, T) log p of each completion token under the policy being trained
    old_logp: Tensor  # (N, T) the same under the policy that sampled the rollouts (no gradient)
    advantages: Tensor  # (N,) one per rollout
    mask: Tensor  # (N, T) the completion's real tokens
    ref_logp: Tensor | None = None  # (N, T) under the reference model, for the KL term


def policy_loss(
    batch: PolicyBatch,
    kind: str,
    *,
    clip_eps: float = 0.2,
    length_constant: int = 1,
    beta: float = 0.0,
    rows_total: int | None = None,
) -> PolicyLossOut:
    """Clipped surrogate of a PolicyBatch.

    per token:  -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A) + beta * KL_k3
    grpo:   mean over sequences of (token sum / the sequence's own length)
    drgrpo: token sum over the batch / (N * length_constant): no per-sequence length normalisation
    KL_k3 = exp(ref - logp) - (ref - logp) - 1, the unbiased non-negative estimator.

    `rows_total`: N when these rows are one micro-batch of a larger batch (default: the rows given).
    Both aggregations are sums over rows divided by a constant of the whole batch, so the losses of
    the micro-batches add up to the whole batch's loss, and so do their gradients.
    A token counts as clipped only where the clip is active: ratio above 1 + eps with A > 0, or
    below 1 - eps with A < 0 (on the other side min() takes the unclipped term).
    """
    logp, old_logp, advantages, mask, ref_logp = (
        batch.logp,
        batch.old_logp,
        batch.advantages,
        batch.mask,
        batch.ref_logp,
    )
    n = logp.shape[0] if rows_total is None else rows_total
    mask_f = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    adv = advantages.unsqueeze(-1)
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    per_token = -surrogate
    kl_sum = 0.0
    if ref_logp is not None and beta > 0:
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + beta * kl
        kl_sum = float((kl.detach() * mask_f).sum())
    if kind == "grpo":
        loss = ((per_token * mask_f).sum(-1) / mask_f.sum(-1).clamp(min=1)).sum() / n
    elif kind == "drgrpo":
        loss = (per_token * mask_f).sum() / (n * length_constant)
    else:
        raise ValueError(f"unknown loss '{kind}'; known: {', '.join(ADVANTAGES)}")
    with torch.no_grad():
        active = ((adv > 0) & (ratio > 1 + clip_eps)) | ((adv < 0) & (ratio < 1 - clip_eps))
        clipped = float((active.to(logp.dtype) * mask_f).sum())
    return PolicyLossOut(loss, clipped, float(mask_f.sum()), kl_sum)


@dataclass(frozen=True)
class IMLPair:
    question: int  # index into the step's questions
    best: int  # expert index (position in the experts used in RL)
    worst: int
    rollout: int  # index of O+ among the best expert's rollouts


def exact_reward(value: float, correct: bool, format_bonus: float) -> Fraction:
    """A reward as the exact number it stands for on paper: 1 for a correct answer plus the format
    bonus as its decimal (0.1 is 1/10, not float32(0.1)). A reward is correct + bonus x present
    (core/answers.score), so {1.1, 1.0, 0.1} are 11/10, 1 and 1/10 here, and means that tie in
    decimals tie exactly: in float32, 1.1 - 1 is not 0.1, so three 1.1s and a 0.1 do not sum to
    three 1.0s and a 0.2."""
    rest = value - float(correct)
    bonus = Fraction(str(format_bonus)) if format_bonus else Fraction(0)
    present = round(rest / format_bonus) if format_bonus else 0
    if present not in (0, 1) or abs(rest - present * format_bonus) > 1e-4:
        raise ValueError(f"reward {value} is not {int(correct)} + {format_bonus} x (0 or 1)")
    return Fraction(int(correct)) + bonus * present


def _exact_means(rewards: Tensor, correct: Tensor, valid: Tensor, format_bonus: float) -> list[list[Fraction]]:
    """Mean reward of every (question, expert) subgroup, exactly (exact_reward): two experts with
    the same rewards in another order, or with rewards that tie in decimals, must tie."""
    out = []
    for q in range(rewards.shape[0]):
        row = []
        for e in range(rewards.shape[1]):
            slots = zip(rewards[q, e].tolist(), correct[q, e].tolist(), valid[q, e].tolist(), strict=True)
            values = [exact_reward(v, c, format_bonus) for v, c, ok in slots if ok]
            row.append(sum(values, Fraction(0)) / len(values) if values else Fraction(0))
        out.append(row)
    return out


def iml_pairs(
    rewards: Tensor, correct: Tensor, valid: Tensor, rng: random.Random | None = None, format_bonus: float = 0.0
) -> list[IMLPair]:
    """Per question: best and worst expert by mean reward (compared exactly: _exact_means, with the
    reward's format bonus); O+ = the best expert's
    first correct rollout. A pair only when the best expert has a correct rollout and beats the
    worst. Ties for best or worst are broken by `rng` (the run passes one seeded by seed and step,
    so resuming draws the same); without it, by the lowest expert index."""
    pairs = []
    for q, means in enumerate(_exact_means(rewards, correct, valid, format_bonus)):
        top, bottom = max(means), min(means)
        if top == bottom:
            continue
        tied_best = [e for e, m in enumerate(means) if m == top]
        tied_worst = [e for e, m in enumerate(means) if m == bottom]
        best = rng.choice(tied_best) if rng else tied_best[0]
        worst = rng.choice(tied_worst) if rng else tied_worst[0]
        good = (correct[q, best] & valid[q, best]).nonzero().flatten()
        if len(good):
            pairs.append(IMLPair(q, best, worst, int(good[0])))
    return pairs


def iml_loss(
    logp_strong: Tensor, logp_weak: Tensor, mask: Tensor, weight: Tensor | None = None, pairs_total: int | None = None
) -> Tensor:
    """L_IML = mean over pairs of mean over O+'s tokens of (sg[log p(O+|Q,P_best)] - log p(O+|Q,P_worst)).

    logp_strong, logp_weak, mask: (M, T), the same O+ tokens scored under the two prompts.
    Minimising it raises log p(O+ | Q, P_worst); the strong side gets no gradient.
    `weight` (M, T), optional: each token's importance weight, w * gap (used on a batch's later
    updates, where O+ was sampled by an older policy; no gradient flows through it).
    `pairs_total`: M when these pairs are one micro-batch of more (default: the pairs given).
    """
    mask_f = mask.to(logp_weak.dtype)
    gap = (logp_strong.detach() - logp_weak) * mask_f
    if weight is not None:
        gap = gap * weight.detach()
    m = logp_weak.shape[0] if pairs_total is None else pairs_total
    return (gap.sum(-1) / mask_f.sum(-1).clamp(min=1)).sum() / m


def sft_loss(logp: Tensor, mask: Tensor, examples_total: int | None = None) -> Tensor:
    """L_SFT = - mean over the examples of mean token log p(O_gt | Q, P_i). logp, mask: (B, T).
    `examples_total`: B when these rows are one micro-batch of more (default: the rows given)."""
    mask_f = mask.to(logp.dtype)
    b = logp.shape[0] if examples_total is None else examples_total
    return -((logp * mask_f).sum(-1) / mask_f.sum(-1).clamp(min=1)).sum() / b
