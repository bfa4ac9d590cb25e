"""The float32 edges a real run reaches: rewards with a format bonus, and group sizes that are not
powers of two. Every decision of equality or threshold must come out as it would on exact numbers."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from fractions import Fraction

import pytest
import torch

from meml.core.config import rollouts_per_expert
from meml.training.buffer import HardExample, HardExampleBuffer
from meml.training.losses import exact_reward, iml_pairs, subgroup_advantages

GROUPS = (6, 8, 12)
BONUSES = (0.0, 0.2, 0.3)


def _rewards(correct: list[list[bool]], bonus: float, counts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards as the RL loop builds them: a float32 (1, E, R) tensor of 1 + bonus or bonus."""
    rewards = torch.zeros(1, len(counts), max(counts))
    valid = torch.zeros(1, len(counts), max(counts), dtype=torch.bool)
    for e, row in enumerate(correct):
        for r, ok in enumerate(row):
            rewards[0, e, r], valid[0, e, r] = float(ok) + bonus, True
    return rewards, valid


@pytest.mark.parametrize(("G", "bonus", "kind"), list(itertools.product(GROUPS, BONUSES, ("grpo", "drgrpo"))))
def test_equal_rewards_give_exactly_zero_advantage(G: int, bonus: float, kind: str) -> None:
    counts = [*rollouts_per_expert(G, 3, "split"), G]  # the three split subgroups and one of G
    for ok in (True, False):
        rewards, valid = _rewards([[ok] * n for n in counts], bonus, counts)
        adv = subgroup_advantages(rewards, valid, kind)
        assert adv.abs().max().item() == 0.0, f"G={G} bonus={bonus} all {'right' if ok else 'wrong'}: {adv}"


@pytest.mark.parametrize(("G", "bonus"), list(itertools.product(GROUPS, BONUSES)))
def test_mixed_group_advantage_by_hand(G: int, bonus: float) -> None:
    # one correct of G: mean = bonus + 1/G; the std does not depend on the bonus
    rewards, valid = _rewards([[True] + [False] * (G - 1)], bonus, [G])
    adv = subgroup_advantages(rewards, valid, "grpo")[0, 0]
    std = ((1 - 1 / G) ** 2 + (G - 1) / G**2) ** 0.5 / (G - 1) ** 0.5
    assert adv[0].item() == pytest.approx((1 - 1 / G) / std, rel=1e-5)
    assert adv[1].item() == pytest.approx((-1 / G) / std, rel=1e-5)


@pytest.mark.parametrize(("G", "bonus"), list(itertools.product(GROUPS, BONUSES)))
def test_same_rewards_in_another_order_form_no_iml_pair(G: int, bonus: float) -> None:
    counts = rollouts_per_expert(G, 2, "split")
    n = counts[0]
    right = [True] + [False] * (n - 1)
    rewards, valid = _rewards([right, right[::-1]], bonus, counts)  # the same rewards, reversed
    correct = rewards > 0.5 + bonus
    assert iml_pairs(rewards, correct, valid, random.Random(0), format_bonus=bonus) == []
    better = [True, True] + [False] * (n - 2)
    rewards, valid = _rewards([right, better], bonus, counts)
    pairs = iml_pairs(rewards, rewards > 0.5 + bonus, valid, random.Random(0), format_bonus=bonus)
    assert [(p.best, p.worst, p.rollout) for p in pairs] == [(1, 0, 0)]


def test_rewards_that_tie_in_decimals_tie_for_iml() -> None:
    """{1.1, 1.0, 0.1} and {1.1, 1.1, 0.0} both sum to 2.2 on paper. As float32 values they do not
    (1.1f + 1.0 + 0.1f < 2 x 1.1f by about 2e-8), so comparing the floats made the second expert
    the best and taught the first. In decimal units they tie: no pair."""
    rewards = torch.tensor([[[1.1, 1.0, 0.1], [1.1, 1.1, 0.0]]], dtype=torch.float32)
    correct = torch.tensor([[[True, True, False], [True, True, False]]])
    valid = torch.ones_like(correct)
    floats = [sum(Fraction(float(v)) for v in rewards[0, e].tolist()) for e in range(2)]
    assert floats[0] != floats[1]  # what the old comparison saw
    assert iml_pairs(rewards, correct, valid, random.Random(0), format_bonus=0.1) == []
    # a reward that is no correct + bonus x present is an error, not a silent rounding
    with pytest.raises(ValueError, match=r"is not 1 \+ 0\.1"):
        exact_reward(1.05, True, 0.1)
    assert exact_reward(1.1, True, 0.1) == Fraction(11, 10) and exact_reward(0.0, False, 0.1) == 0


@pytest.mark.parametrize("G", GROUPS)
def test_failure_rate_equal_to_k_over_g_is_not_above_it(G: int) -> None:
    for K in range(G):
        buf = HardExampleBuffer(capacity=100, threshold=K / G, insert_prob=1.0)
        assert not buf.offer(HardExample(f"q{K}", 0), K, G), f"{K} of {G} failures counted as above {K}/{G}"
        assert buf.offer(HardExample(f"q{K}", 1), K + 1, G)
    # the same threshold on a subgroup of another size (the split spread): 2 of 3 is below 0.75
    buf = HardExampleBuffer(capacity=100, threshold=0.75, insert_prob=1.0)
    assert not buf.offer(HardExample("q", 0), 2, 3) and buf.offer(HardExample("q", 0), 3, 3)


def test_iml_ties_are_broken_at_random_not_by_index() -> None:
    """Experts of equal skill: each should be the learner (the worst) and the teacher (the best)
    about equally often. Argmin/argmax gave expert 0 about half of the learner roles."""
    gen = random.Random(7)
    rng = random.Random(11)
    worst, best = Counter(), Counter()
    for _ in range(6000):
        correct = [[gen.random() < 0.5 for _ in range(3)] for _ in range(3)]
        rewards, valid = _rewards(correct, 0.0, [3, 3, 3])
        for p in iml_pairs(rewards, rewards > 0.5, valid, rng):
            worst[p.worst] += 1
            best[p.best] += 1
    total = sum(worst.values())
    shares = {e: worst[e] / total for e in range(3)}
    print(f"learner shares over {total} pairs: {shares}; teacher shares: {[best[e] / total for e in range(3)]}")
    for e in range(3):
        assert abs(worst[e] / total - 1 / 3) < 0.03
        assert abs(best[e] / total - 1 / 3) < 0.03
    # without a generator the documented rule is the lowest index
    rewards, valid = _rewards([[False] * 3, [False] * 3, [True] * 3], 0.0, [3, 3, 3])
    assert [(p.best, p.worst) for p in iml_pairs(rewards, rewards > 0.5, valid)] == [(2, 0)]
