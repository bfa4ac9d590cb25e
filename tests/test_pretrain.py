"""Pretraining of the tiny models: the text it reads, and that it trains them, the same way twice."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from meml.data.experts import DEFAULT_PROMPTS
from meml.data.pretrain import arithmetic_fact, corpus, token_stream
from meml.data.tiny_models import build_tiny_models, toy_corpus


def test_arithmetic_facts_are_true() -> None:
    rng = random.Random(0)
    for _ in range(2000):
        a, op, b, c = re.fullmatch(r"(\d+) ([-+*/]) (\d+) = (\d+)", arithmetic_fact(rng)).groups()  # type: ignore[union-attr]
        a_, b_, c_ = int(a), int(b), int(c)
        assert {"+": a_ + b_, "-": a_ - b_, "*": a_ * b_, "/": a_ // b_ if b_ else -1}[op] == c_
        assert op != "/" or a_ == b_ * c_  # divisions are exact


def test_corpus_leaves_the_test_questions_out() -> None:
    from meml.data.toy.gsm8k import generate

    test = [row["question"] for row, _ in generate(random.Random("a test split"), 40, max_ops=1)]
    fresh = corpus([], seed=0, documents=3000, max_ops=1)
    seen = [q for q in test if any(text.startswith(q + "\n") for text in fresh)]
    # one-step problems repeat often enough that an unfiltered corpus would hold test questions
    assert seen, "the check below needs a corpus that would contain a test question"
    texts = corpus(test, seed=0, documents=3000, max_ops=1)
    assert not [q for q in test if any(text.startswith(q + "\n") for text in texts)]
    assert len(texts) == 3000 and texts == corpus(test, seed=0, documents=3000, max_ops=1)
    facts = [t for t in texts if t[0].isdigit()]
    assert 0.25 < len(facts) / len(texts) < 0.35  # fact_share 0.3
    problems = [t for t in texts if not t[0].isdigit()]
    assert all(re.search(r"\n#### \d+$", t) for t in problems)  # each worked to a "#### N" line
    styles = [sum("<think>" in t for t in problems), sum("Check:" in t for t in problems)]
    assert all(0.25 < n / len(problems) < 0.42 for n in styles)  # expert 1's and expert 2's styles, a third each
    assert not any("<<" in t for t in problems)  # the terse style as the loader prepares it


def test_token_stream_separates_documents(small_world: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    folder = build_tiny_models(toy_corpus(small_world, DEFAULT_PROMPTS), tmp_path, 0, 400, kinds=["llama"])["llama"]
    tok = AutoTokenizer.from_pretrained(folder)
    stream = token_stream(tok, ["1 + 1 = 2", "3 * 3 = 9"])
    assert stream == tok("1 + 1 = 2")["input_ids"] + [tok.pad_token_id] + tok("3 * 3 = 9")["input_ids"] + [
        tok.pad_token_id
    ]


@pytest.fixture(scope="module")
def pretrained(small_world: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    texts = corpus([], seed=0, documents=400, max_ops=1)
    settings = {"texts": texts, "steps": 12, "lr": 3e-3, "batch_size": 4}
    words = toy_corpus(small_world, DEFAULT_PROMPTS)
    out = tmp_path_factory.mktemp("pretrain")
    plain = build_tiny_models(words, out / "plain", 0, 400, kinds=["llama"])["llama"]
    a = build_tiny_models(words, out / "a", 0, 400, kinds=["llama"], pretraining=settings)["llama"]
    b = build_tiny_models(words, out / "b", 0, 400, kinds=["llama"], pretraining=settings)["llama"]
    return plain, a, b


def test_pretraining_lowers_the_loss_and_repeats(pretrained: tuple[Path, Path, Path]) -> None:
    plain, a, b = pretrained
    losses = json.loads((a / "pretrain_losses.json").read_text())
    assert losses["steps"] == 12 and losses["loss"][-1] < losses["loss"][0] - 0.5
    assert not (plain / "pretrain_losses.json").exists()
    wa = AutoModelForCausalLM.from_pretrained(a).state_dict()
    wb = AutoModelForCausalLM.from_pretrained(b).state_dict()
    w0 = AutoModelForCausalLM.from_pretrained(plain).state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)  # same seed, same weights
    assert not torch.equal(wa["model.embed_tokens.weight"], w0["model.embed_tokens.weight"])


def test_too_little_text_names_the_key(pretrained: tuple[Path, Path, Path]) -> None:
    from transformers import AutoTokenizer

    from meml.core.io import DataError
    from meml.data.pretrain import pretrain

    plain = pretrained[0]
    model, tok = AutoModelForCausalLM.from_pretrained(plain), AutoTokenizer.from_pretrained(plain)
    expected = r"field 'toy\.pretrain\.documents': the pretraining text has \d+ tokens, fewer than one window of 128"
    with pytest.raises(DataError, match=expected):
        pretrain(model, tok, ["1 + 1 = 2"], steps=1, seed=0)
