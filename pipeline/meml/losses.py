"""Every formula of the RL stage in one place: advantages, the clipped policy loss (GRPO and
Dr.GRPO aggregation), the KL penalty, inter-expert mutual learning (IML) and the SFT term.

Shapes: Q questions, E experts, R rollouts per expert (ragged rollouts padded, `valid` marks the
real ones), N = flattened sequences, T = completion tokens (padded, `mask` marks real tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

ADVANTAGES = ("grpo", "drgrpo")


def subgroup_advantages(rewards: Tensor, valid: Tensor, kind: str) -> Tensor:
    """Advantage of every rollout within its (question, expert) subgroup. rewards, valid: (Q, E, R).

    grpo:   A = (r - mean) / std  (std unbiased, as torch.std); a subgroup whose rewards are all
            equal, or that has one rollout, gets A = 0 (never NaN or inf)
    drgrpo: A = r - mean          (no division by the std)
    """
    if kind not in ADVANTAGES:
        raise ValueError(f"unknown advantage '{kind}'; known: {', '.join(ADVANTAGES)}")
    valid_f = valid.to(rewards.dtype)
    n = valid_f.sum(-1, keepdim=True)
    mean = (rewards * valid_f).sum(-1, keepdim=True) / n.clamp(min=1)
    centered = (rewards - mean) * valid_f
    if kind == "drgrpo":
        return centered
    std = ((centered**2).sum(-1, keepdim=True) / (n - 1).clamp(min=1)).sqrt()
    safe = std > 1e-8
    return torch.where(safe, centered / torch.where(safe, std, torch.ones_like(std)), torch.zeros_like(centered))


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


def iml_pairs(rewards: Tensor, correct: Tensor, valid: Tensor) -> list[IMLPair]:
    """Per question: best and worst expert by mean reward; O+ = the best expert's first correct
    rollout. A pair only when the best expert has a correct rollout and beats the worst."""
    valid_f = valid.to(rewards.dtype)
    means = (rewards * valid_f).sum(-1) / valid_f.sum(-1).clamp(min=1)  # (Q, E)
    pairs = []
    for q in range(rewards.shape[0]):
        best = int(torch.argmax(means[q]))
        worst = int(torch.argmin(means[q]))
        good = (correct[q, best] & valid[q, best]).nonzero().flatten()
        if means[q, best] > means[q, worst] and len(good):
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
