"""Every RL formula against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from meml.training.losses import PolicyBatch, iml_loss, iml_pairs, policy_loss, sft_loss, subgroup_advantages


def test_grpo_advantages_by_hand_with_ragged_3_3_2_subgroups() -> None:
    # one question, three experts with 3/3/2 rollouts (the `split` spread of G = 8)
    rewards = torch.tensor([[[1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 1.0, 9.0]]])
    valid = torch.tensor([[[True, True, True], [True, True, True], [True, True, False]]])
    adv = subgroup_advantages(rewards, valid, "grpo")
    # expert 0: mean 1/3, unbiased std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3)
    s = math.sqrt(1 / 3)
    assert adv[0, 0].tolist() == pytest.approx([(2 / 3) / s, (-1 / 3) / s, (-1 / 3) / s])
    assert adv[0, 1].tolist() == [0.0, 0.0, 0.0]  # all equal: zero, not NaN
    # expert 2: two valid rollouts [0, 1]: mean 0.5, unbiased std sqrt(0.5); the padded slot stays 0
    assert adv[0, 2].tolist() == pytest.approx([-0.5 / math.sqrt(0.5), 0.5 / math.sqrt(0.5), 0.0])


def test_drgrpo_advantages_do_not_divide_by_std() -> None:
    rewards = torch.tensor([[[1.0, 0.0, 0.0, 0.0]]])
    valid = torch.ones_like(rewards, dtype=torch.bool)
    assert subgroup_advantages(rewards, valid, "drgrpo")[0, 0].tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_all_wrong_and_single_rollout_subgroups_are_finite_zero() -> None:
    rewards = torch.tensor([[[0.0, 0.0], [1.0, 0.0]]])
    valid = torch.tensor([[[True, True], [True, False]]])
    for kind in ("grpo", "drgrpo"):
        adv = subgroup_advantages(rewards, valid, kind)
        assert torch.isfinite(adv).all() and adv.abs().sum() == 0
    with pytest.raises(ValueError, match="unknown advantage"):
        subgroup_advantages(rewards, valid, "ppo")


def _two_sequences() -> dict[str, torch.Tensor]:
    # sequence 0 has 2 real tokens, sequence 1 has 1 (plus one padding token)
    return {
        "logp": torch.log(torch.tensor([[0.5, 0.25], [0.4, 0.9]])),
        "mask": torch.tensor([[1, 1], [1, 0]]),
        "advantages": torch.tensor([1.0, -2.0]),
    }


def test_grpo_loss_aggregation_by_hand() -> None:
    t = _two_sequences()
    # on-policy (old = new, ratio 1): per-token loss = -A; GRPO = mean over sequences of token means
    out = policy_loss(PolicyBatch(t["logp"], t["logp"].detach(), t["advantages"], t["mask"]), "grpo")
    assert out.loss.item() == pytest.approx(((-1 - 1) / 2 + 2 / 1) / 2)  # 0.5
    assert out.clip_fraction == 0.0


def test_drgrpo_loss_aggregation_by_hand() -> None:
    t = _two_sequences()
    out = policy_loss(
        PolicyBatch(t["logp"], t["logp"].detach(), t["advantages"], t["mask"]), "drgrpo", length_constant=4
    )
    assert out.loss.item() == pytest.approx((-1 - 1 + 2) / (2 * 4))  # token sum / (N * constant) = 0


def test_clipping_and_kl_by_hand() -> None:
    logp = torch.log(torch.tensor([[0.6]]))
    old = torch.log(torch.tensor([[0.4]]))  # ratio 1.5
    pos = policy_loss(PolicyBatch(logp, old, torch.tensor([1.0]), torch.tensor([[1]])), "grpo", clip_eps=0.2)
    assert pos.loss.item() == pytest.approx(-1.2) and pos.clip_fraction == 1.0  # min(1.5, 1.2) * 1
    neg = policy_loss(PolicyBatch(logp, old, torch.tensor([-1.0]), torch.tensor([[1]])), "grpo", clip_eps=0.2)
    assert neg.loss.item() == pytest.approx(1.5)  # min(-1.5, -1.2) = -1.5
    # ratio 1.5 with A < 0: min() takes the unclipped term, the clip is inactive and not counted
    assert neg.clip_fraction == 0.0
    # ratio 0.5 (below 1 - eps): active for A < 0, inactive for A > 0
    low = torch.log(torch.tensor([[0.3]]))
    assert (
        policy_loss(
            PolicyBatch(low, torch.log(torch.tensor([[0.6]])), torch.tensor([-1.0]), torch.tensor([[1]])), "grpo"
        ).clip_fraction
        == 1.0
    )
    assert (
        policy_loss(
            PolicyBatch(low, torch.log(torch.tensor([[0.6]])), torch.tensor([1.0]), torch.tensor([[1]])), "grpo"
        ).clip_fraction
        == 0.0
    )
    ref = torch.log(torch.tensor([[0.3]]))
    with_kl = policy_loss(
        PolicyBatch(logp, logp.detach(), torch.tensor([0.0]), torch.tensor([[1]]), ref), "grpo", beta=0.1
    )
    d = math.log(0.3) - math.log(0.6)
    assert with_kl.kl == pytest.approx(math.exp(d) - d - 1)
    assert with_kl.loss.item() == pytest.approx(0.1 * (math.exp(d) - d - 1))


def test_iml_pairs_pick_best_and_worst() -> None:
    rewards = torch.tensor(
        [
            [[1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]],  # best 0, worst 1, O+ = rollout 0
            [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0]],  # all tie: no pair
            [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],  # nobody correct: no pair
            [[0.0, 0.0, 0.0], [0.0, 0.0, 9.0], [0.0, 1.0, 0.0]],  # expert 1's third slot is padding
        ]
    )
    valid = torch.ones_like(rewards, dtype=torch.bool)
    valid[3, 1, 2] = False
    pairs = iml_pairs(rewards, rewards > 0.5, valid)
    assert [(p.question, p.best, p.worst, p.rollout) for p in pairs] == [(0, 0, 1, 0), (3, 2, 0, 1)]


def test_iml_loss_value_by_hand() -> None:
    strong = torch.log(torch.tensor([[0.5, 0.5]]))
    weak = torch.log(torch.tensor([[0.25, 0.125]]))
    mask = torch.tensor([[1, 1]])
    expected = ((math.log(0.5) - math.log(0.25)) + (math.log(0.5) - math.log(0.125))) / 2
    assert iml_loss(strong, weak, mask).item() == pytest.approx(expected)


def test_iml_step_raises_weak_side_and_leaves_strong_side() -> None:
    """One optimiser step on L_IML alone raises log p(O+ | Q, P_worst); the strong side gets no gradient."""
    torch.manual_seed(0)
    logits_weak = torch.randn(3, 5, requires_grad=True)
    logits_strong = torch.randn(3, 5, requires_grad=True)
    target = torch.tensor([1, 3, 2])

    def logp(logits: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(logits, -1).gather(-1, target[:, None]).squeeze(-1)[None, :]

    before = logp(logits_weak).sum().item()
    loss = iml_loss(logp(logits_strong), logp(logits_weak), torch.ones(1, 3))
    loss.backward()
    assert logits_strong.grad is None or logits_strong.grad.abs().sum() == 0
    torch.optim.SGD([logits_weak, logits_strong], lr=0.5).step()
    assert logp(logits_weak).sum().item() > before


def test_sft_loss_by_hand() -> None:
    logp = torch.log(torch.tensor([[0.5, 0.25], [0.1, 1.0]]))
    mask = torch.tensor([[1, 1], [1, 0]])
    expected = -((math.log(0.5) + math.log(0.25)) / 2 + math.log(0.1)) / 2
    assert sft_loss(logp, mask).item() == pytest.approx(expected)
