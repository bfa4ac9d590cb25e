"""The scoring passes (training/scoring.py): each distinct prompt once, then the completions
attending to its keys and values. Checked against the plainest reference, one unpadded forward
pass per row, for values, entropies and gradients, on both tiny architectures; and the IML strong
side taken from the policy pass equals its own no-grad pass."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from meml.data.experts import DEFAULT_PROMPTS
from meml.data.tiny_models import build_tiny_models, toy_corpus
from meml.training.losses import iml_loss
from meml.training.scoring import completion_logprobs, padded_tokens, scores_whole_rows


@pytest.fixture(scope="module")
def models(small_world: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("scoring_models")
    return build_tiny_models(toy_corpus(small_world, DEFAULT_PROMPTS), out, seed=3, vocab_size=400)


def _rows(seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """An RL-shaped batch: 5 prompts of 4-13 tokens (one a prefix of another), each with 1-4
    rollouts of 1-9 tokens, in shuffled order."""
    rng = random.Random(seed)
    base = [rng.randrange(3, 390) for _ in range(13)]
    prompts = [base[:4], base[:13], [rng.randrange(3, 390) for _ in range(7)], base[:9], [7, 7, 7, 7, 7]]
    rows = [
        (p, [rng.randrange(3, 390) for _ in range(rng.randint(1, 9))])
        for p in prompts
        for _ in range(rng.randint(1, 4))
    ]
    rows.append((prompts[0], [11]))  # a one-token completion
    rng.shuffle(rows)
    return [p for p, _ in rows], [c for _, c in rows]


def _reference(model: Any, prompts: list[list[int]], completions: list[list[int]]) -> tuple[list[Any], list[Any]]:
    """Per row: log p of each completion token and the entropy of its distribution, from one
    unpadded pass over prompt + completion (the logits at position t predict token t + 1)."""
    logps, entropies = [], []
    for p, c in zip(prompts, completions, strict=True):
        logits = model(input_ids=torch.tensor([p + c])).logits[0].float()
        log_probs = torch.log_softmax(logits[len(p) - 1 : len(p) + len(c) - 1], -1)  # (len(c), V)
        logps.append(log_probs.gather(1, torch.tensor(c)[:, None]).squeeze(1))
        entropies.append(-(log_probs.exp() * log_probs).sum(-1))
    return logps, entropies


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("rows_per_pass", [1, 3, 64])
def test_values_equal_one_pass_per_row(models: dict[str, Path], arch: str, rows_per_pass: int) -> None:
    model = AutoModelForCausalLM.from_pretrained(models[arch]).eval()
    prompts, completions = _rows(0)
    with torch.no_grad():
        logp, mask, entropy = completion_logprobs(model, prompts, completions, pad=0, with_entropy=True,
                                                  rows_per_pass=rows_per_pass)  # fmt: skip
        want_logp, want_entropy = _reference(model, prompts, completions)
    assert entropy is not None
    t = max(len(c) for c in completions)
    assert logp.shape == mask.shape == entropy.shape == (len(prompts), t)
    for row, c in enumerate(completions):
        n = len(c)
        assert mask[row].tolist() == [True] * n + [False] * (t - n)
        assert torch.allclose(logp[row, :n], want_logp[row], atol=1e-5), row
        assert torch.allclose(entropy[row, :n], want_entropy[row], atol=1e-5), row
        assert not logp[row, n:].any() and not entropy[row, n:].any()  # zero past the completion


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_gradients_equal_one_pass_per_row(models: dict[str, Path], arch: str) -> None:
    """The prompt pass is shared by its rows: the gradient through its keys and values must add up
    to what separate passes give (relative error of each parameter's gradient under 1e-4)."""
    prompts, completions = _rows(1)
    weights = torch.linspace(-1.0, 1.0, len(prompts))

    def grads(score: Any) -> dict[str, torch.Tensor]:
        model = AutoModelForCausalLM.from_pretrained(models[arch]).train()
        per_row = score(model)
        loss = sum((w * lp.sum() for w, lp in zip(weights, per_row, strict=True)), torch.zeros(()))
        loss.backward()
        return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    def shared(model: Any) -> list[torch.Tensor]:
        logp, mask, _ = completion_logprobs(model, prompts, completions, pad=0, rows_per_pass=4)
        return [logp[row][mask[row]] for row in range(len(prompts))]

    got = grads(shared)
    want = grads(lambda model: _reference(model, prompts, completions)[0])
    assert got.keys() == want.keys()
    for name in want:
        scale = want[name].norm().clamp(min=1e-12)
        assert (got[name] - want[name]).norm() / scale < 1e-4, name


def test_padding_token_and_order_do_not_matter(models: dict[str, Path]) -> None:
    """A pad id that is also a real token, and the rows given in another order, change nothing."""
    model = AutoModelForCausalLM.from_pretrained(models["qwen2"]).eval()
    prompts, completions = _rows(2)
    with torch.no_grad():
        a, _, _ = completion_logprobs(model, prompts, completions, pad=0)
        b, _, _ = completion_logprobs(model, prompts, completions, pad=prompts[0][0])
        order = list(reversed(range(len(prompts))))
        c, _, _ = completion_logprobs(model, [prompts[i] for i in order], [completions[i] for i in order], pad=0)
    assert torch.allclose(a, b, atol=1e-6)
    assert torch.allclose(a, c[torch.tensor(order)], atol=1e-6)


def test_an_empty_completion_is_refused(models: dict[str, Path]) -> None:
    model = AutoModelForCausalLM.from_pretrained(models["qwen2"]).eval()
    with pytest.raises(ValueError, match="at least one token"):
        completion_logprobs(model, [[5, 6]], [[]], pad=0)


def test_iml_strong_side_from_the_policy_pass_equals_its_own_pass(models: dict[str, Path]) -> None:
    """update_step takes log p(O+ | Q, P_best) from O+'s own row of the policy pass instead of a
    separate no-grad pass: the same value to float32 rounding, and no gradient through it."""
    model = AutoModelForCausalLM.from_pretrained(models["qwen2"]).train()
    prompts, completions = _rows(3)
    best = 2  # a row whose completion plays O+; the weak side scores it under another prompt
    weak_prompt = next(p for p in prompts if p != prompts[best])
    rows_p, rows_c = [*prompts, weak_prompt], [*completions, completions[best]]
    logp, mask, _ = completion_logprobs(model, rows_p, rows_c, pad=0)
    n, length = len(prompts), len(completions[best])
    strong = torch.zeros((1, logp.shape[1]))
    strong[0, :length] = logp[best, :length]
    loss = iml_loss(strong, logp[n : n + 1], mask[n : n + 1])
    with torch.no_grad():
        alone, alone_mask, _ = completion_logprobs(model, [prompts[best]], [completions[best]], pad=0)
        weak_alone, _, _ = completion_logprobs(model, [weak_prompt], [completions[best]], pad=0)
    assert torch.allclose(strong[:, :length], alone, atol=1e-5)
    assert torch.allclose(loss, iml_loss(alone, weak_alone, alone_mask), atol=1e-5)
    loss.backward()  # only the weak side's row carries the gradient
    model.zero_grad()
    strong_only = iml_loss(strong, logp[n : n + 1].detach(), mask[n : n + 1])
    assert not strong_only.requires_grad


def test_a_policy_under_gradient_checkpointing_is_scored_whole(models: dict[str, Path]) -> None:
    """transformers' layers drop the cache under gradient checkpointing in training mode (the GPU
    default), which would leave the completions without their prompts: such a policy is scored
    prompt + completion per row, with the same values and gradients."""
    prompts, completions = _rows(4)
    model = AutoModelForCausalLM.from_pretrained(models["llama"]).train()
    model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert model.is_gradient_checkpointing
    logp, mask, entropy = completion_logprobs(model, prompts, completions, pad=0, with_entropy=True, rows_per_pass=3)
    assert entropy is not None
    want_logp, want_entropy = _reference(model, prompts, completions)
    for row, c in enumerate(completions):
        assert torch.allclose(logp[row, : len(c)], want_logp[row], atol=1e-5)
        assert torch.allclose(entropy[row, : len(c)], want_entropy[row], atol=1e-5)
        assert mask[row].sum() == len(c) and not logp[row, len(c) :].any()
    logp.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("whole", [False, True])
def test_padded_tokens_are_the_positions_the_passes_run(models: dict[str, Path], whole: bool) -> None:
    """scoring.padded_tokens, which the micro-batches' budget counts (rl.micro_batch_tokens), is the
    number of positions the decoder runs, padding included, in either layout: the shared prompt pass
    and its completion passes, or each row whole under gradient checkpointing. A capped rollout among
    short ones of its prompt pads its pass to its own length."""
    model = AutoModelForCausalLM.from_pretrained(models["llama"]).train()
    if whole:
        model.config.use_cache = False
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert scores_whole_rows(model) == whole
    prompts, completions = _rows(5)
    prompts, completions = prompts + [prompts[0]] * 8, completions + [[5] * 40] + [[6] * 3] * 7
    ran: list[int] = []
    model.get_decoder().register_forward_pre_hook(
        lambda _m, _a, kw: ran.append(kw["input_ids"].numel()), with_kwargs=True
    )
    for rows_per_pass in (1, 3, 8):
        ran.clear()
        completion_logprobs(model, prompts, completions, pad=0, rows_per_pass=rows_per_pass)
        assert sum(ran) == padded_tokens(prompts, completions, whole, rows_per_pass)
    # the capped row with its seven short siblings, in one pass: eight rows at its length, not the sum of theirs
    group_p, group_c = [prompts[0]] * 8, [[5] * 40] + [[6] * 3] * 7
    own = sum(len(p) + len(c) for p, c in zip(group_p, group_c, strict=True))
    assert padded_tokens(group_p, group_c, True) == 8 * (len(prompts[0]) + 40) > 2 * own
