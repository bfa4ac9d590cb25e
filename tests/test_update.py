"""The RL update at the shapes that matter on a GPU (training/rl.update_step): micro-batches whose
gradients add up to the one-shot update's, memory that follows the longest micro-batch and not
the batch, and log-probs taken at the temperature the rollouts were sampled at."""

from __future__ import annotations

import random
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from meml.core.precision import resolve
from meml.data.experts import DEFAULT_PROMPTS
from meml.data.tiny_models import build_tiny_models, toy_corpus
from meml.training.distributed import Dist
from meml.training.kv_decode import KVEngine
from meml.training.losses import IMLPair, PolicyBatch, iml_loss, policy_loss, sft_loss
from meml.training.rl import HSFTBatch, IMLBatch, Learner, RLSettings, Sequences, update_step
from meml.training.rollout import HFEngine, Sampling
from meml.training.scoring import completion_logprobs, micro_batches, padded_tokens
from tests.test_rl import CONFIG


@pytest.fixture(scope="module")
def models(small_world: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("update_models")
    return build_tiny_models(toy_corpus(small_world, DEFAULT_PROMPTS), out, seed=5, vocab_size=400)


def _settings(**changes: Any) -> RLSettings:
    rl = {**CONFIG["rl"], "max_grad_norm": 1e9, "temperature": 0.7, **changes}
    return RLSettings.from_config(rl)


def _learner(model: Any, lr: float = 0.0) -> Learner:
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    sft_optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0)
    return Learner(model, None, optimizer, sft_optimizer, scheduler, resolve("cpu"), pad=0)


def _batch(seed: int, vocab: int = 390) -> tuple[Sequences, IMLBatch, HSFTBatch]:
    """Two questions x three experts with 3/3/2 rollouts of 1-12 tokens; two IML pairs whose O+ is a
    policy row; three HSFT examples (one longer than any rollout)."""
    rng = random.Random(seed)
    prompt = [[[rng.randrange(3, vocab) for _ in range(rng.randint(4, 9))] for _ in range(3)] for _ in range(2)]
    positions = [(q, e, r) for q in range(2) for e, n in enumerate([3, 3, 2]) for r in range(n)]
    completions = {p: [rng.randrange(3, vocab) for _ in range(rng.randint(1, 12))] for p in positions}
    seqs = Sequences(
        positions,
        [prompt[q][e] for q, e, _ in positions],
        [completions[p] for p in positions],
        torch.tensor([rng.uniform(-1.5, 1.5) for _ in positions]),
        [None] * len(positions),
    )
    pairs = [IMLPair(0, 1, 2, 0), IMLPair(1, 0, 1, 2)]
    iml = IMLBatch(pairs, [prompt[p.question][p.worst] for p in pairs],
                   [completions[(p.question, p.best, p.rollout)] for p in pairs])  # fmt: skip
    hsft = HSFTBatch(
        0,
        [],
        [prompt[0][2], prompt[1][1], prompt[1][0]],
        [[rng.randrange(3, vocab) for _ in range(n)] for n in (5, 17, 2)],
    )
    return seqs, iml, hsft


def _one_shot_gradient(model: Any, s: RLSettings, kind: str, seqs: Sequences, iml: IMLBatch, hsft: HSFTBatch) -> Any:
    """The update as one scoring call and one backward, written out from the formulas: the
    reference the micro-batched update must equal."""
    model.zero_grad(set_to_none=True)
    n, m = len(seqs.prompts), len(iml.pairs)
    # the model's own rollouts (policy rows, and O+ under the weak prompt) at the sampling temperature
    logp, mask, _ = completion_logprobs(
        model, seqs.prompts + iml.weak, seqs.completions + iml.tokens, 0, temperature=s.temperature
    )
    # HSFT's gold solutions at temperature 1, in either buffer mode
    sft_logp, sft_mask, _ = completion_logprobs(model, hsft.prompts, hsft.targets, 0, temperature=1.0)
    rows = PolicyBatch(logp[:n], logp[:n].detach(), seqs.advantages, mask[:n])
    pl = policy_loss(rows, kind, clip_eps=s.clip_eps, length_constant=s.max_new_tokens)
    strong_rows = [seqs.positions.index((p.question, p.best, p.rollout)) for p in iml.pairs]
    l_iml = iml_loss(logp[strong_rows], logp[n : n + m], mask[n : n + m])
    l_sft = sft_loss(sft_logp, sft_mask)
    (pl.loss + s.lambda_iml * l_iml + s.lambda_sft * l_sft).backward()
    return {k: p.grad.clone() for k, p in model.named_parameters()}


@pytest.mark.parametrize("kind", ["grpo", "drgrpo"])
@pytest.mark.parametrize("budget", [1, 40, 10**6])
def test_micro_batched_gradient_equals_the_one_shot_gradient(models: dict[str, Path], kind: str, budget: int) -> None:
    model = AutoModelForCausalLM.from_pretrained(models["qwen2"]).train()
    s = _settings(micro_batch_tokens=budget, lambda_iml=0.3, lambda_sft=0.5)
    seqs, iml, hsft = _batch(0)
    expected = _one_shot_gradient(model, s, kind, seqs, iml, hsft)
    if budget == 40:  # the budget really cuts the batch
        assert len(micro_batches(seqs.prompts, seqs.completions, budget)) > 3
    update_step(_learner(model), s, kind, seqs, iml, hsft, Dist(0, 1, "cpu"))
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, expected[name], atol=2e-6, rtol=1e-4), name


def test_micro_batches_keep_prompts_together_and_respect_the_budget() -> None:
    prompts = [[1] * 4, [2] * 4, [1] * 4, [3] * 4, [2] * 4, [1] * 4]
    completions = [[9] * 2, [9] * 30, [9] * 3, [9] * 2, [9] * 1, [9] * 5]
    for whole in (False, True):
        batches = micro_batches(prompts, completions, 30, whole)
        assert sorted(r for b in batches for r in b) == list(range(6))  # every row once
        for b in batches:  # in padded tokens, as the passes pad them
            assert padded_tokens([prompts[r] for r in b], [completions[r] for r in b], whole) <= 30 or len(b) == 1
    # the prompt-[1] rows share one micro-batch with the short prompt-[3] row (prompts 2 x 4 tokens,
    # one pass of 4 completions padded to 4 = 24); the 34-token row is alone, its prompt's short
    # sibling split off into a micro-batch of its own before it
    assert micro_batches(prompts, completions, 30) == [[3, 0, 2, 5], [4], [1]]
    # scored whole, the prompt-[3] row no longer fits beside them (4 rows padded to 9 = 36)
    assert micro_batches(prompts, completions, 30, whole=True) == [[3], [0, 2, 5], [4], [1]]


def _saved_bytes_peak(fn: Any, model: Any) -> int:
    """The most bytes autograd holds for backward at any moment while `fn` runs: each storage
    counted once however many nodes save it, parameters aside (they are the model's, not the
    batch's). A saved tensor is released when its graph is freed (after its backward)."""
    live = peak = 0
    holders: dict[int, int] = {}  # storage -> how many saved references hold it
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    class Held:
        def __init__(self, t: torch.Tensor) -> None:
            self.t = t

    def pack(t: torch.Tensor) -> Any:
        nonlocal live, peak
        key = t.untyped_storage().data_ptr()
        if key in params:
            return t
        size = t.untyped_storage().nbytes()
        if holders.get(key, 0) == 0:
            live += size
            peak = max(peak, live)
        holders[key] = holders.get(key, 0) + 1
        held = Held(t)

        def release() -> None:
            nonlocal live
            holders[key] -= 1
            if holders[key] == 0:
                live -= size

        weakref.finalize(held, release)
        return held

    def unpack(h: Any) -> torch.Tensor:
        return h.t if isinstance(h, Held) else h

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        fn()
    return peak


@pytest.mark.parametrize("long", [50, 200])
def test_saved_bytes_follow_the_longest_micro_batch_not_the_batch(long: int) -> None:
    """A one-layer model with SmolLM2's 49,152-token vocabulary; 15 rows of 10 tokens and one of
    `long`. One-shot, the long row's pass pads seven short rows to its length and every pass's graph
    stays alive until the one backward; in micro-batches, only one micro-batch's graph is alive."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49_152, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512)  # fmt: skip
    model = LlamaForCausalLM(config).train()
    rng = random.Random(1)
    positions = [(q, 0, r) for q in range(4) for r in range(4)]
    prompts = [[rng.randrange(3, 49_000) for _ in range(6)] for _ in range(4)]
    completions = [[rng.randrange(3, 49_000) for _ in range(long if i == 5 else 10)] for i in range(16)]
    seqs = Sequences(positions, [prompts[q] for q, _, _ in positions], completions,
                     torch.linspace(-1, 1, 16), [None] * 16)  # fmt: skip
    vocab_row = 49_152 * 4  # one fp32 log-prob row of the vocabulary

    def run(budget: int) -> int:
        def step() -> None:
            update_step(_learner(model), _settings(micro_batch_tokens=budget), "grpo", seqs, IMLBatch([]), HSFTBatch(),
                        Dist(0, 1, "cpu"))  # fmt: skip

        return _saved_bytes_peak(step, model)

    one_shot, micro = run(10**6), run(64)
    print(f"long row {long}: one-shot {one_shot / 2**20:.0f} MiB, micro-batched {micro / 2**20:.0f} MiB")
    # the longest micro-batch is the long row alone: about `long` vocabulary rows, kept once
    assert micro < 1.5 * long * vocab_row + 2**20
    # one-shot keeps every pass, the long one padded to its length with seven neighbours
    assert one_shot > 6 * long * vocab_row


@pytest.mark.parametrize("engine_kind", ["kv", "hf"])
@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_the_learner_scores_the_tokens_at_the_samplers_temperature(
    models: dict[str, Path], temperature: float, engine_kind: str
) -> None:
    """The kv engine and transformers' generate report each drawn token's log-prob; the learner's,
    at the same weights and temperature, equals it to fp32 round-off. Scored at temperature 1
    instead (the old learner), a rollout sampled at 0.7 is off by far more: the check would have
    caught it at the first step. (vLLM's: tests/test_vllm.py.)"""
    from transformers import AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(models["llama"]).eval()
    tokenizer = AutoTokenizer.from_pretrained(models["llama"])
    engine = KVEngine(model, tokenizer, batch_size=16) if engine_kind == "kv" else HFEngine(model, tokenizer, 16)
    torch.manual_seed(0)
    prompts = [[5, 9, 14, 3, 6], [7, 2, 30, 31]]
    drawn = engine.generate(prompts, 4, Sampling(max_new_tokens=24, temperature=temperature))
    rows = [(p, c) for p, group in zip(prompts, drawn, strict=True) for c in group]
    with torch.no_grad():
        logp, _, _ = completion_logprobs(model, [p for p, _ in rows], [c.token_ids for _, c in rows], 0,
                                            temperature=temperature)  # fmt: skip
        at_one, _, _ = completion_logprobs(model, [p for p, _ in rows], [c.token_ids for _, c in rows], 0)
    gaps, gaps_at_one = [], []
    for i, (_, c) in enumerate(rows):
        assert c.logprobs is not None and len(c.logprobs) == len(c.token_ids)
        sampled = torch.tensor(c.logprobs)
        gaps.append((logp[i, : len(sampled)] - sampled).abs())
        gaps_at_one.append((at_one[i, : len(sampled)] - sampled).abs())
    gap, gap_at_one = float(torch.cat(gaps).max()), float(torch.cat(gaps_at_one).max())
    print(f"{engine_kind} T={temperature}: max gap {gap:.2e} at T, {gap_at_one:.2e} when scored at 1")
    assert gap < 1e-4
    if temperature != 1.0:
        assert gap_at_one > 1e-2


def test_several_updates_per_batch(models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """updates_per_batch = 3, in bf16 under autocast: the first update's ratio is exactly 1 (the
    old log-probs come from the same micro-batches as the update's), IML is weighted by O+'s
    clipped importance ratio on the later updates (none on the first), HSFT's term joins the first
    update only, and the schedule steps once for the RL step, not once per update."""
    from meml.core.precision import Precision
    from meml.training import rl

    model = AutoModelForCausalLM.from_pretrained(models["qwen2"]).train()
    learner = _learner(model, lr=1e-2)
    learner.precision = Precision("cpu", "bfloat16", False)
    s = _settings(micro_batch_tokens=40, updates_per_batch=3, lambda_iml=0.3, clip_eps=0.2)
    seqs, iml, hsft = _batch(1)
    ratios: list[torch.Tensor] = []
    weights: list[torch.Tensor | None] = []
    sft_rows: list[int] = []
    policy_loss_of, iml_loss_of, sft_loss_of = rl.policy_loss, rl.iml_loss, rl.sft_loss

    def policy_loss(batch: PolicyBatch, *args: Any, **kwargs: Any) -> Any:
        ratios.append((batch.logp.detach() - batch.old_logp).exp())
        return policy_loss_of(batch, *args, **kwargs)

    def iml_loss(strong: Any, weak: Any, mask: Any, weight: Any = None, **kwargs: Any) -> Any:
        weights.append(weight)
        return iml_loss_of(strong, weak, mask, weight, **kwargs)

    def sft_loss(logp: Any, *args: Any, **kwargs: Any) -> Any:
        sft_rows.append(logp.shape[0])
        return sft_loss_of(logp, *args, **kwargs)

    monkeypatch.setattr(rl, "policy_loss", policy_loss)
    monkeypatch.setattr(rl, "iml_loss", iml_loss)
    monkeypatch.setattr(rl, "sft_loss", sft_loss)
    update_step(learner, s, "grpo", seqs, iml, hsft, Dist(0, 1, "cpu"))
    per_update = len(micro_batches(seqs.prompts, seqs.completions, 40))
    first, later = ratios[:per_update], ratios[per_update:]
    assert len(later) == 2 * per_update
    assert all(torch.equal(r, torch.ones_like(r)) for r in first)  # exactly 1, not 1 + bf16 round-off
    assert any(not torch.allclose(r, torch.ones_like(r)) for r in later)  # the policy moved
    assert all(w is None for w in weights[: len(weights) // 3])
    later_weights = [w for w in weights[len(weights) // 3 :] if w is not None]
    assert later_weights and all(float(w.min()) >= 0.8 - 1e-6 and float(w.max()) <= 1.2 + 1e-6 for w in later_weights)
    assert sum(sft_rows) == len(hsft.prompts)  # the first update only
    assert learner.scheduler.last_epoch == 1  # one RL step


def test_the_reference_in_the_policys_precision_gives_kl_zero_at_the_start(models: dict[str, Path]) -> None:
    """beta > 0 in bf16: the reference is the same fp32 weights under the same autocast as the
    policy, so before any update the KL is exactly 0 (a bf16 copy of the weights was not)."""
    import copy

    from meml.core.precision import Precision

    model = AutoModelForCausalLM.from_pretrained(models["qwen2"]).train()
    learner = _learner(model)
    learner.precision = Precision("cpu", "bfloat16", False)
    learner.reference = copy.deepcopy(model).eval().requires_grad_(False)
    seqs, _, _ = _batch(2)
    stats = update_step(learner, _settings(beta=0.1), "grpo", seqs, IMLBatch([]), HSFTBatch(), Dist(0, 1, "cpu"))
    assert stats["kl"] == 0.0
    learner.reference = copy.deepcopy(model).to(torch.bfloat16).eval().requires_grad_(False)
    stats = update_step(learner, _settings(beta=0.1), "grpo", seqs, IMLBatch([]), HSFTBatch(), Dist(0, 1, "cpu"))
    assert stats["kl"] > 0.0  # the old bf16 reference: a KL at step 0 from rounding alone


def test_the_clipped_share_is_measured_on_the_updates_where_the_clip_can_act(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first update's ratio is 1 by construction, so clipping is counted on the later ones:
    with updates_per_batch 2 and a large step the second update clips some tokens, and the logged
    share is exactly its clipped tokens over its tokens (from the loss's own counts); with one
    update a batch it is 0."""
    from meml.training import rl

    counts: list[tuple[float, float]] = []
    policy_loss_of = rl.policy_loss

    def counted(*args: Any, **kwargs: Any) -> Any:
        out = policy_loss_of(*args, **kwargs)
        counts.append((out.clipped, out.tokens))
        return out

    monkeypatch.setattr(rl, "policy_loss", counted)
    model = AutoModelForCausalLM.from_pretrained(models["qwen2"]).train()
    seqs, _, _ = _batch(3)
    s = _settings(micro_batch_tokens=40, updates_per_batch=2, clip_eps=0.05)
    stats = update_step(_learner(model, lr=3e-2), s, "grpo", seqs, IMLBatch([]), HSFTBatch(), Dist(0, 1, "cpu"))
    per_update = len(micro_batches(seqs.prompts, seqs.completions, 40))
    first, second = counts[:per_update], counts[per_update:]
    assert sum(c for c, _ in first) == 0.0  # ratio exactly 1
    expected = sum(c for c, _ in second) / sum(t for _, t in second)
    assert expected > 0.0 and stats["clip_fraction"] == pytest.approx(expected)
    once = update_step(
        _learner(model, lr=3e-2), _settings(), "grpo", seqs, IMLBatch([]), HSFTBatch(), Dist(0, 1, "cpu")
    )
    assert once["clip_fraction"] == 0.0


@pytest.mark.parametrize("mode", ["joint", "separate"])
def test_hsft_scores_its_gold_solutions_at_temperature_one_in_both_modes(models: dict[str, Path], mode: str) -> None:
    """HSFT's L_SFT is the mean token NLL of the gold solutions under the model at temperature 1
    (as MEF scores them), whatever rl.temperature and rl.buffer.update are; at the sampling
    temperature it would be another number. lr 0: the logged loss is the one at the start weights."""
    from meml.training.rl import SUPERVISED_TEMPERATURE

    assert SUPERVISED_TEMPERATURE == 1.0
    model = AutoModelForCausalLM.from_pretrained(models["qwen2"]).train()
    seqs, _, hsft = _batch(4)
    hsft = HSFTBatch(0, [None] * len(hsft.prompts), hsft.prompts, hsft.targets)  # type: ignore[list-item]
    buffer = {**CONFIG["rl"]["buffer"], "update": mode}
    s = _settings(temperature=0.5, buffer=buffer)
    with torch.no_grad():
        at_one, mask, _ = completion_logprobs(model, hsft.prompts, hsft.targets, 0, temperature=1.0)
        at_t, _, _ = completion_logprobs(model, hsft.prompts, hsft.targets, 0, temperature=0.5)
    by_hand = float(sft_loss(at_one, mask))
    stats = update_step(_learner(model), s, "grpo", seqs, IMLBatch([]), hsft, Dist(0, 1, "cpu"))
    assert stats["loss/sft"] == pytest.approx(by_hand, rel=1e-5)
    assert abs(float(sft_loss(at_t, mask)) - by_hand) > 1e-2


def test_relative_weight_change_by_hand() -> None:
    """||theta_after - theta_before|| / ||theta_before||: weights (3, 4) moved by (0, 0.5) and a
    bias 0 moved by 0: 0.5 / 5 = 0.1."""
    from meml.training.rl import relative_change, weights_before

    layer = torch.nn.Linear(2, 1)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[3.0, 4.0]]))
        layer.bias.zero_()
    before = weights_before(layer)
    with torch.no_grad():
        layer.weight.add_(torch.tensor([[0.0, 0.5]]))
    assert relative_change(layer, before) == pytest.approx(0.1, rel=1e-12)


def test_the_shuffled_control_permutes_the_steps_advantages() -> None:
    """The control keeps every rollout's tokens and the step's advantages as a multiset, in another
    order, the same order for the same (seed, step)."""
    from meml.training.rl import shuffled

    seqs, _, _ = _batch(5)
    one = shuffled(seqs, random.Random("shuffle-0-3-0"))
    again = shuffled(seqs, random.Random("shuffle-0-3-0"))
    assert torch.equal(one.advantages, again.advantages)
    assert not torch.equal(one.advantages, seqs.advantages)
    assert sorted(one.advantages.tolist()) == sorted(seqs.advantages.tolist())
    assert one.completions == seqs.completions and one.prompts == seqs.prompts


@pytest.mark.parametrize("kind", ["grpo", "drgrpo"])
def test_rows_without_advantage_are_not_back_propagated_and_the_gradient_is_unchanged(
    models: dict[str, Path], kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows whose advantage is 0 add nothing to the loss (beta 0): the update scores them once
    without a graph (for the entropy) and back-propagates the rest. The gradient equals the
    one-shot update's over every row, and the logged entropy is over every rollout's tokens."""
    import dataclasses

    from meml.training import rl

    model = AutoModelForCausalLM.from_pretrained(models["qwen2"]).train()
    s = _settings(micro_batch_tokens=40, lambda_iml=0.3, lambda_sft=0.5)
    seqs, iml, hsft = _batch(6)
    zeroed = seqs.advantages.clone()
    strong = {seqs.positions.index((p.question, p.best, p.rollout)) for p in iml.pairs}
    zero_rows = [r for r in range(0, len(zeroed), 2) if r not in strong]
    zeroed[zero_rows] = 0.0
    seqs = dataclasses.replace(seqs, advantages=zeroed)
    expected = _one_shot_gradient(model, s, kind, seqs, iml, hsft)
    with torch.no_grad():
        _, mask, entropy = completion_logprobs(model, seqs.prompts, seqs.completions, 0, True, temperature=0.7)
    assert entropy is not None
    graded: list[list[int]] = []
    scored = rl.completion_logprobs

    def watched(model: Any, prompts: list[list[int]], targets: list[list[int]], *args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled():
            graded.extend(targets)
        return scored(model, prompts, targets, *args, **kwargs)

    monkeypatch.setattr(rl, "completion_logprobs", watched)
    stats = update_step(_learner(model), s, kind, seqs, iml, hsft, Dist(0, 1, "cpu"))
    assert not any(
        seqs.completions[r] in graded and seqs.completions.count(seqs.completions[r]) == 1 for r in zero_rows
    )
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, expected[name], rtol=1e-4, atol=1e-6), name
    assert stats["entropy"] == pytest.approx(float((entropy * mask).sum() / mask.sum()), rel=1e-5)
