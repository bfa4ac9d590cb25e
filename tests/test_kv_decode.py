"""The CPU sampling engine (training/kv_decode.py) against transformers' generate: the same greedy
tokens on every prompt of a batch, samples from the same distribution, stop tokens, rows that leave
the batch, a cut at max_new_tokens marked unfinished, and the same numbers for the same seed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from meml.core.attention import attention_kwargs
from meml.core.records import read_records
from meml.core.stops import stop_tokens
from meml.data.experts import DEFAULT_PROMPTS
from meml.data.tiny_models import build_tiny_models, toy_corpus
from meml.training import kv_decode
from meml.training.kv_decode import KVEngine, UnsupportedModel, top_p_filter
from meml.training.rollout import HFEngine, Sampling, prompt_ids

STYLES = {"qwen2": "toy", "llama": "toy"}  # the toy world's models
REAL_SMOKE_STYLES = {"qwen2": "qwen-base", "llama": "llama-instruct"}  # config/real-smoke.yaml's


@pytest.fixture(scope="module")
def models(small_world: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny models in the toy world's tokenizer style and in real-smoke's two styles."""
    root = tmp_path_factory.mktemp("kv-models")
    corpus = list(toy_corpus(small_world, DEFAULT_PROMPTS))
    out = {f"toy-{k}": v for k, v in build_tiny_models(corpus, root / "toy", seed=0, vocab_size=400).items()}
    smoke = build_tiny_models(corpus, root / "smoke", seed=1, vocab_size=400, styles=REAL_SMOKE_STYLES)
    return {**out, **{f"smoke-{k.split('-')[0]}": v for k, v in smoke.items()}}  # keys: kind-style


def _load(path: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path, **attention_kwargs("cpu")), AutoTokenizer.from_pretrained(path)


def _stopping(path: Path, prompts: list[list[int]]) -> tuple[Any, Any]:
    """A tiny model that stops now and then. A random model almost never samples its stop token,
    so the stop token's output row is set to c * u (u a fixed random +-1 vector): its logit c * (h . u)
    wins at some positions and not at others. c grows until transformers' greedy output has rows
    that stop early and rows cut at 48 tokens."""
    model, tokenizer = _load(path)
    u = torch.randint(0, 2, (model.config.hidden_size,), generator=torch.Generator().manual_seed(0)) * 2.0 - 1
    best = (0, 0.0)
    for c in [0.05 * 1.1**k for k in range(32)]:  # the switch from never to always stopping is sharp
        with torch.no_grad():
            model.lm_head.weight[stop_tokens(tokenizer).ids[0]] = c * u
        lengths = [len(g[0].token_ids) for g in HFEngine(model, tokenizer).generate(prompts, 1, GREEDY)]
        if max(lengths) == 48:
            best = max(best, (len(set(lengths)), c))
    with torch.no_grad():
        model.lm_head.weight[stop_tokens(tokenizer).ids[0]] = best[1] * u
    return model, tokenizer


GREEDY = Sampling(max_new_tokens=48, greedy=True)


def _prompts(world: Path, tokenizer: Any, count: int = 20) -> list[list[int]]:
    records = read_records(world / "data/gsm8k/test.jsonl", "gsm8k")[:count]
    chats = [[{"role": "system", "content": DEFAULT_PROMPTS[i % 3]}, {"role": "user", "content": r.question}]
             for i, r in enumerate(records)]  # fmt: skip
    return [prompt_ids(tokenizer, chat) for chat in chats]


@pytest.mark.parametrize("name", ["toy-qwen2", "toy-llama", "smoke-qwen2", "smoke-llama"])
def test_greedy_tokens_equal_transformers_generate(name: str, models: dict[str, Path], small_world: Path) -> None:
    prompts = _prompts(small_world, _load(models[name])[1])
    model, tokenizer = _stopping(models[name], prompts)  # rows stop at many steps, some never
    want = HFEngine(model, tokenizer).generate(prompts, 1, GREEDY)
    got = KVEngine(model, tokenizer).generate(prompts, 1, GREEDY)
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        assert g[0].token_ids == w[0].token_ids, f"prompt {i}"
        assert (g[0].finished, g[0].text) == (w[0].finished, w[0].text), f"prompt {i}"


def test_stops_rows_leaving_and_the_cut(
    models: dict[str, Path], small_world: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = _prompts(small_world, _load(models["toy-qwen2"])[1])
    model, tokenizer = _stopping(models["toy-qwen2"], prompts)
    stops = set(stop_tokens(tokenizer).ids)
    compacted = KVEngine(model, tokenizer).generate(prompts, 1, GREEDY)
    monkeypatch.setattr(kv_decode, "COMPACT_BELOW", 0.0)  # done rows ride along to the end
    riding = KVEngine(model, tokenizer).generate(prompts, 1, GREEDY)
    assert [c[0].token_ids for c in compacted] == [c[0].token_ids for c in riding]
    finished = [c[0] for c in compacted if c[0].finished]
    cut = [c[0] for c in compacted if not c[0].finished]
    assert len(finished) >= 2 and cut  # rows left the batch before the last step
    for c in finished:  # ends with its stop token, and only there; the text leaves it out
        assert c.token_ids[-1] in stops and not stops & set(c.token_ids[:-1])
        assert c.text == tokenizer.decode(c.token_ids[:-1], skip_special_tokens=True)
    for c in cut:  # cut at max_new_tokens: exactly that many tokens, no stop, marked unfinished
        assert len(c.token_ids) == 48 and not stops & set(c.token_ids)


def test_counts_batches_and_the_same_seed(models: dict[str, Path], small_world: Path) -> None:
    model, tokenizer = _load(models["toy-llama"])
    prompts = _prompts(small_world, tokenizer, 5)
    sampling = Sampling(max_new_tokens=24, temperature=0.7)
    torch.manual_seed(3)
    whole = KVEngine(model, tokenizer, batch_size=64).generate(prompts, [3, 1, 4, 2, 6], sampling)
    assert [len(g) for g in whole] == [3, 1, 4, 2, 6]
    torch.manual_seed(3)
    again = KVEngine(model, tokenizer, batch_size=64).generate(prompts, [3, 1, 4, 2, 6], sampling)
    assert [[c.token_ids for c in g] for g in whole] == [[c.token_ids for c in g] for g in again]
    torch.manual_seed(4)
    other = KVEngine(model, tokenizer, batch_size=64).generate(prompts, [3, 1, 4, 2, 6], sampling)
    assert [[c.token_ids for c in g] for g in whole] != [[c.token_ids for c in g] for g in other]
    split = KVEngine(model, tokenizer, batch_size=5).generate(prompts, [3, 1, 4, 2, 6], Sampling(24, greedy=True))
    one = KVEngine(model, tokenizer, batch_size=64).generate(prompts, [3, 1, 4, 2, 6], Sampling(24, greedy=True))
    assert [[c.token_ids for c in g] for g in split] == [[c.token_ids for c in g] for g in one]


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_sampled_tokens_follow_the_model_distribution(
    temperature: float, top_p: float, models: dict[str, Path], small_world: Path
) -> None:
    """4,000 first tokens of one prompt against the exact probabilities of transformers' own
    warpers (temperature, top-p): no token outside the top-p set, and a chi-square test over the
    tokens expected at least 5 times (the rest pooled) that must not reject at 0.1%."""
    from scipy.stats import chisquare
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

    model, tokenizer = _load(models["toy-qwen2"])
    [prompt] = _prompts(small_world, tokenizer, 1)
    draws = 4000
    torch.manual_seed(0)
    [samples] = KVEngine(model, tokenizer, batch_size=draws).generate(
        [prompt], draws, Sampling(max_new_tokens=1, temperature=temperature, top_p=top_p)
    )
    counts = torch.bincount(torch.tensor([s.token_ids[0] for s in samples]), minlength=model.config.vocab_size)
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[:, -1].float()
    scores = TemperatureLogitsWarper(temperature)(None, logits)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    probs = scores.softmax(-1)[0].double()
    assert int(counts[probs == 0].sum()) == 0  # nothing outside the top-p set
    big = probs * draws >= 5
    assert int(big.sum()) >= 5 and float(probs[big].sum()) > 0.5  # the test has something to test
    observed = torch.cat([counts[big].double(), counts[~big].double().sum()[None]])
    expected = torch.cat([probs[big], probs[~big].sum()[None]])
    keep = expected > 0  # the pooled bin is empty where every token is expected 5 times
    observed, expected = observed[keep], expected[keep] / expected[keep].sum() * draws
    assert chisquare(observed.numpy(), expected.numpy()).pvalue > 1e-3


def test_top_p_filter_matches_transformers() -> None:
    from transformers.generation.logits_process import TopPLogitsWarper

    torch.manual_seed(0)
    logits = torch.randn(16, 50) * 3
    for top_p in (0.1, 0.5, 0.9, 0.999):
        want = TopPLogitsWarper(top_p)(None, logits.clone())
        assert torch.equal(top_p_filter(logits, top_p), want)
    assert torch.equal(top_p_filter(logits, 1.0), logits)


def test_an_unsupported_model_is_refused_by_name() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    with pytest.raises(UnsupportedModel, match=r"not 'gpt2'.*rl\.engine: hf"):
        KVEngine(model, None)


def test_rms_norm_and_decode_attention_match_transformers() -> None:
    """The fused RMSNorm equals transformers' bit for bit; the grouped decode attention equals SDPA
    with shared key/value heads under a padding mask to float32 rounding."""
    import torch.nn.functional as F
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    norm = LlamaRMSNorm(64, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64))
        for shape in [(7, 1, 64), (1, 13, 64), (5, 64)]:
            x = torch.randn(shape) * 3
            assert torch.equal(kv_decode.rms_norm(x, norm.weight, 1e-6), norm(x))
    b, heads, kv_heads, d, s = 6, 4, 2, 16, 29
    q, keys, values = torch.randn(b, heads, 1, d), torch.randn(b, kv_heads, s, d), torch.randn(b, kv_heads, s, d)
    mask = torch.ones(b, 1, 1, s, dtype=torch.bool)
    for row in range(b):
        mask[row, ..., : 2 * row] = False  # left padding of 0-10 columns
    bias = torch.zeros(mask.shape).masked_fill_(~mask, float("-inf"))
    want = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=d**-0.5, enable_gqa=True)
    got = kv_decode.decode_attention(q, keys, values, bias, d**-0.5)
    assert torch.allclose(got, want, atol=1e-6)
    assert not torch.allclose(got, kv_decode.decode_attention(q, keys, values, torch.zeros_like(bias), d**-0.5))
