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


def test_corpus_of_three_domains_holds_each_worked_correctly_and_no_test_question() -> None:
    from meml.core.answers import extract
    from meml.data.toy import mathqa, strategyqa

    kb = strategyqa.knowledge_base(random.Random("creatures"))
    test_sqa = [q.text for q in (strategyqa.make_question(random.Random(i), kb) for i in range(300))]
    test_mqa = [mathqa.make_problem(random.Random(i), small=True).text for i in range(60)]
    domains = ("gsm8k", "strategyqa", "mathqa")
    settings = dict(seed=0, documents=3000, max_ops=1, domains=domains, knowledge_base=kb, mathqa_small=True)
    unfiltered = {t.split("\n")[0] for t in corpus([], **settings)}  # type: ignore[arg-type]
    # both question spaces are small enough that an unfiltered corpus holds test questions
    assert unfiltered & set(test_sqa) and unfiltered & set(test_mqa), "the exclusion check below needs them"
    texts = corpus(test_sqa + test_mqa, **settings)  # type: ignore[arg-type]
    assert texts == corpus(test_sqa + test_mqa, **settings)  # type: ignore[arg-type]
    facts = {c.fact(a) for c in kb for a in ("legs", "weight", "habitat", "active")}
    passages = [t for t in texts if t.startswith("A ")]
    questions = [t for t in texts if t.endswith(("So the answer is yes.", "So the answer is no."))]
    problems = [t for t in texts if "\nOptions: a ) " in t]
    for share in (len(passages) + len(questions), len(problems)):
        assert 0.28 < share / len(texts) < 0.39  # a third each
    assert all(set(t.split("\n")) <= facts for t in passages)  # every passage line is a fact of the world
    assert 0.22 < len(passages) / (len(passages) + len(questions)) < 0.45  # a third of StrategyQA documents
    yes = sum(t.endswith("yes.") for t in questions)
    assert 0.4 < yes / len(questions) < 0.6  # both answers equally often
    for t in questions:  # each worked answer is what the knowledge base says
        assert t.endswith("yes." if _answer(t.split("\n")[0], kb) else "no.")
    assert not [t for t in questions + problems if t.split("\n")[0] in set(test_sqa + test_mqa)]
    for t in problems:  # the letter each solution ends with names the option holding the value
        options = dict(re.findall(r"([a-e]) \) ([^,]+?)(?: ,|$)", t.split("\n")[1].removeprefix("Options: ")))
        assert extract(t, "mathqa", "strict") in options
    styles = [sum("<think>" in t for t in problems), sum(t.split("\n")[2].startswith("let me") for t in problems)]
    assert all(0.25 < n / len(problems) < 0.42 for n in styles)


def _answer(question: str, kb: list) -> bool:
    """A toy StrategyQA question's answer, worked out here from the creatures' facts."""
    c = {creature.name: creature for creature in kb}
    rules = [
        (r"Does a (\w+) have more legs than a (\w+)\?", lambda a, b: c[a].legs > c[b].legs),
        (r"Could a (\w+) meet a (\w+) near its home\?", lambda a, b: c[a].habitat == c[b].habitat),
        (r"Would a (\w+) be awake at the same time as a (\w+)\?", lambda a, b: c[a].active == c[b].active),
        (r"Could a (\w+) carry three (\w+)s if it can carry its own weight\?",
         lambda a, b: c[a].weight >= 3 * c[b].weight),
        (r"Do two (\w+)s have more legs in total than a (\w+)\?", lambda a, b: 2 * c[a].legs > c[b].legs),
        (r"Could a (\w+) and a (\w+) together outweigh a (\w+)\?",
         lambda a, b, z: c[a].weight + c[b].weight > c[z].weight),
    ]  # fmt: skip
    for pattern, rule in rules:
        if match := re.fullmatch(pattern, question):
            return bool(rule(*match.groups()))
    raise AssertionError(f"not a toy StrategyQA question: {question}")


def test_a_bad_domain_or_a_missing_knowledge_base_names_the_key(tmp_path: Path) -> None:
    from meml.core.io import DataError
    from meml.data.pretrain import read_knowledge_base

    with pytest.raises(DataError, match=r"toy\.pretrain\.domains.*each one of"):
        corpus([], seed=0, documents=10, domains=("gsm8k", "poetry"))
    with pytest.raises(DataError, match=r"toy\.pretrain\.domains.*creatures"):
        corpus([], seed=0, documents=10, domains=("strategyqa",))
    with pytest.raises(DataError, match=r"knowledge_base\.json.*toy\.pretrain\.domains"):
        read_knowledge_base(tmp_path)


def test_strategyqa_pretraining_questions_follow_the_worlds_per_kind_balance() -> None:
    """With toy.strategyqa_per_kind the base model reads questions whose kind says nothing about
    their answer, as the world's data sets then are; without it, kinds lean one way."""
    from meml.data.toy import strategyqa

    kb = strategyqa.knowledge_base(random.Random("creatures"))

    def yes_share_by_kind(per_kind: bool) -> dict[str, float]:
        texts = corpus([], seed=0, documents=3000, domains=("strategyqa",), knowledge_base=kb,
                       strategyqa_per_kind=per_kind)  # type: ignore[arg-type]  # fmt: skip
        said: dict[str, list[bool]] = {}
        for t in texts:
            if t.endswith(("So the answer is yes.", "So the answer is no.")):
                said.setdefault(strategyqa.kind_of(t.split("\n")[0]), []).append(t.endswith("yes."))
        return {k: sum(v) / len(v) for k, v in said.items()}

    assert max(abs(share - 0.5) for share in yes_share_by_kind(False).values()) > 0.25
    balanced = yes_share_by_kind(True)
    assert len(balanced) == 6 and max(abs(share - 0.5) for share in balanced.values()) < 0.12, balanced
