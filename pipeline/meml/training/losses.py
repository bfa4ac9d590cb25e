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
    clip_fraction: float
    kl: float


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    kind: str,
    clip_eps: float = 0.2,
    length_constant: int = 1,
    ref_logp: Tensor | None = None,
    beta: float = 0.0,
) -> PolicyLossOut:
    """Clipped surrogate. logp, old_logp, mask, ref_logp: (N, T); advantages: (N,).

    per token:  -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A) + beta * KL_k3
    grpo:   mean over sequences of (token sum / the sequence's own length)
    drgrpo: token sum over the batch / (N * length_constant): no per-sequence length normalisation
    KL_k3 = exp(ref - logp) - (ref - logp) - 1, the unbiased non-negative estimator.
    """
    mask_f = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    adv = advantages.unsqueeze(-1)
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    per_token = -surrogate
    kl_mean = 0.0
    if ref_logp is not None and beta > 0:
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + beta * kl
        kl_mean = float((kl * mask_f).sum() / mask_f.sum().clamp(min=1))
    if kind == "grpo":
        loss = ((per_token * mask_f).sum(-1) / mask_f.sum(-1).clamp(min=1)).mean()
    elif kind == "drgrpo":
        loss = (per_token * mask_f).sum() / (logp.shape[0] * length_constant)
    else:
        raise ValueError(f"unknown loss '{kind}'; known: {', '.join(ADVANTAGES)}")
    clipped = ((ratio - 1).abs() > clip_eps).to(logp.dtype)
    clip_fraction = float((clipped * mask_f).sum() / mask_f.sum().clamp(min=1))
    return PolicyLossOut(loss, clip_fraction, kl_mean)


@dataclass(frozen=True)
class IMLPair:
    question: int  # index into the step's questions
    best: int  # expert index (position in the experts used in RL)
    worst: int
    rollout: int  # index of O+ among the best expert's rollouts


def _exact_means(rewards: Tensor, valid: Tensor) -> list[list[Fraction]]:
    """Mean reward of every (question, expert) subgroup as an exact fraction of the float32 rewards:
    two experts with the same rewards in another order must tie, which rounded float means do not."""
    out = []
    for q in range(rewards.shape[0]):
        row = []
        for e in range(rewards.shape[1]):
            pairs = zip(rewards[q, e].tolist(), valid[q, e].tolist(), strict=True)
            values = [Fraction(float(v)) for v, ok in pairs if ok]
            row.append(sum(values, Fraction(0)) / len(values) if values else Fraction(0))
        out.append(row)
    return out


def iml_pairs(rewards: Tensor, correct: Tensor, valid: Tensor, rng: random.Random | None = None) -> list[IMLPair]:
    """Per question: best and worst expert by mean reward (compared exactly); O+ = the best expert's
    first correct rollout. A pair only when the best expert has a correct rollout and beats the
    worst. Ties for best or worst are broken by `rng` (the run passes one seeded by seed and step,
    so resuming draws the same); without it, by the lowest expert index."""
    pairs = []
    for q, means in enumerate(_exact_means(rewards, valid)):
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


def iml_loss(logp_strong: Tensor, logp_weak: Tensor, mask: Tensor) -> Tensor:
    """L_IML = mean over pairs of mean over O+'s tokens of (sg[log p(O+|Q,P_best)] - log p(O+|Q,P_worst)).

    logp_strong, logp_weak, mask: (M, T), the same O+ tokens scored under the two prompts.
    Minimising it raises log p(O+ | Q, P_worst); the strong side gets no gradient.
    """
    mask_f = mask.to(logp_weak.dtype)
    gap = (logp_strong.detach() - logp_weak) * mask_f
    return (gap.sum(-1) / mask_f.sum(-1).clamp(min=1)).mean()


def sft_loss(logp: Tensor, mask: Tensor) -> Tensor:
    """L_SFT = - mean over the examples of mean token log p(O_gt | Q, P_i). logp, mask: (B, T)."""
    mask_f = mask.to(logp.dtype)
    return -((logp * mask_f).sum(-1) / mask_f.sum(-1).clamp(min=1)).mean()
