"""Pretraining for the tiny models: what a real base model brings to SFT, in a few minutes.

A randomly initialised tiny model does not learn from a thousand SFT examples both to copy the
numbers out of a question and to do the arithmetic (measured: 10-15% greedy accuracy on one-step
toy GSM8K after up to 2,250 SFT steps). The paper's base models arrive knowing both. This step
gives the tiny models a small version of that: next-token training on text the toy generators
write but that is not the data set, namely arithmetic facts and fresh toy GSM8K problems, each
worked in one of the three styles the experts write (terse, long chain, reflective), as a real
base model has read worked solutions of many kinds. SFT then still has to teach which system
prompt asks for which style. No test question appears in it (checked by text), so the test split
stays unseen; training questions may, as the real GSM8K train split sits in web corpora.

The corpus covers the data sets in `toy.pretrain.domains`: GSM8K as above; StrategyQA as passages
of the toy world's creature facts (the encyclopedia a base model has read) and fresh questions
worked in the three styles; MathQA as fresh problems with their options, worked likewise.

`toy.pretrain.steps: 0` (the default) skips it: the default grid's models stay random.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from meml.core.answers import canonical_answer_line
from meml.core.io import DataError
from meml.data.toy import gsm8k as toy_gsm8k
from meml.data.toy import mathqa as toy_mathqa
from meml.data.toy import strategyqa as toy_strategyqa


def arithmetic_fact(rng: random.Random) -> str:
    """One line such as "7 + 5 = 12", in the number ranges the toy problems use."""
    op = rng.choice("+-*/")
    if op == "+":
        a, b = rng.randint(0, 60), rng.randint(0, 20)
        return f"{a} + {b} = {a + b}"
    if op == "-":
        a = rng.randint(1, 60)
        b = rng.randint(0, min(a, 20))
        return f"{a} - {b} = {a - b}"
    if op == "*":
        a, b = rng.randint(0, 40), rng.randint(0, 9)
        return f"{a} * {b} = {a * b}"
    b, c = rng.randint(1, 9), rng.randint(0, 20)
    return f"{b * c} / {b} = {c}"


def corpus(
    exclude: Iterable[str],
    seed: int,
    documents: int,
    max_ops: int | None = None,
    fact_share: float = 0.3,
    domains: Sequence[str] = ("gsm8k",),
    knowledge_base: Sequence[toy_strategyqa.Creature] = (),
    mathqa_small: bool = False,
    strategyqa_per_kind: bool = False,
) -> list[str]:
    """`documents` texts, each from one of `domains` drawn at random (see the writers below);
    questions in `exclude` are skipped. With GSM8K alone no domain is drawn, so that corpus is
    the same text it was before the other domains existed. StrategyQA needs the world's
    `knowledge_base` (its creatures' facts: what a base model would have read about them)."""
    rng = random.Random(f"pretrain-{seed}")
    excluded = set(exclude)
    unknown = [d for d in domains if d not in WRITERS]
    if unknown or not domains:
        raise DataError(f"pretraining domains {list(domains)}: each one of {sorted(WRITERS)}", None, None,
                        "toy.pretrain.domains")  # fmt: skip
    if "strategyqa" in domains and not knowledge_base:
        raise DataError("StrategyQA pretraining needs the world's creatures (raw/strategyqa/knowledge_base.json)",
                        None, None, "toy.pretrain.domains")  # fmt: skip
    settings = {
        "gsm8k": (max_ops, fact_share),
        "strategyqa": (list(knowledge_base), strategyqa_per_kind),
        "mathqa": (mathqa_small,),
    }
    texts: list[str] = []
    while len(texts) < documents:
        domain = domains[0] if len(domains) == 1 else rng.choice(list(domains))
        text = WRITERS[domain](rng, excluded, *settings[domain])
        if text is not None:
            texts.append(text)
    return texts


def _gsm8k_document(rng: random.Random, excluded: set[str], max_ops: int | None, fact_share: float) -> str | None:
    """A `fact_share` of lines of arithmetic facts, else a fresh toy GSM8K problem followed by a
    worked solution in a style drawn at random (the prepared data set's terse one, without
    calculator notes, or expert 1's or expert 2's)."""
    if rng.random() < fact_share:
        return "\n".join(arithmetic_fact(rng) for _ in range(8))
    problem = toy_gsm8k.make_problem(rng, max_ops)
    if problem.question in excluded:  # before the style is drawn: the stream of earlier corpora
        return None
    style = rng.randrange(3)
    if style == 0:
        solution = re.sub(r"<<.*?>>", "", toy_gsm8k.render_e0(problem))  # as the loader prepares it
    elif style == 1:
        solution = toy_gsm8k.render_e1(problem)
    else:
        solution = toy_gsm8k.render_e2(problem, rng)
    return f"{problem.question}\n{solution}"


def _strategyqa_document(
    rng: random.Random, excluded: set[str], kb: list[toy_strategyqa.Creature], per_kind: bool = False
) -> str | None:
    """A third: a passage of facts about six creatures, in random order (the encyclopedia a base
    model has read); else a fresh question, yes or no equally often (`per_kind`: within each kind of
    question, as the world's data sets then are: toy_strategyqa.generate), worked in one of the
    three styles (the data set's facts-then-answer, expert 1's or expert 2's)."""
    if rng.random() < 1 / 3:
        facts = [c.fact(a) for c in rng.sample(kb, min(6, len(kb))) for a in ("legs", "weight", "habitat", "active")]
        rng.shuffle(facts)
        return "\n".join(facts)
    wanted = rng.random() < 0.5
    if per_kind:
        question = toy_strategyqa.make_question(rng, kb, rng.choice(toy_strategyqa.KINDS), wanted)
    else:
        question = toy_strategyqa.make_question(rng, kb)
        while question.answer != wanted:
            question = toy_strategyqa.make_question(rng, kb)
    if question.text in excluded:
        return None
    style = rng.randrange(3)
    if style == 0:
        recalled = " ".join(c.fact(a) for c, a in question.facts)
        solution = f"{recalled} {canonical_answer_line('strategyqa', 'yes' if question.answer else 'no')}"
    elif style == 1:
        solution = toy_strategyqa.render_e1(question)
    else:
        solution = toy_strategyqa.render_e2(question, rng)
    return f"{question.text}\n{solution}"


def _mathqa_document(rng: random.Random, excluded: set[str], small: bool) -> str | None:
    """A fresh toy MathQA problem with its five options, as the user turn shows them, worked in
    one of the three styles."""
    problem = toy_mathqa.make_problem(rng, small)
    if problem.text in excluded:
        return None
    options, correct = toy_mathqa.options_for(rng, problem)
    listed = " , ".join(f"{k} ) {v}" for k, v in options.items())
    style = rng.randrange(3)
    if style == 0:
        solution = toy_mathqa.render_e0(problem, correct)
    elif style == 1:
        solution = toy_mathqa.render_e1(problem, options, correct)
    else:
        solution = toy_mathqa.render_e2(problem, options, correct, rng)
    return f"{problem.text}\nOptions: {listed}\n{solution}"


WRITERS: dict[str, Callable[..., str | None]] = {
    "gsm8k": _gsm8k_document,
    "strategyqa": _strategyqa_document,
    "mathqa": _mathqa_document,
}


def read_knowledge_base(root: str | Path) -> list[toy_strategyqa.Creature]:
    """The toy world's StrategyQA creatures, as the world wrote them (raw/strategyqa/knowledge_base.json)."""
    path = Path(root) / "raw" / "strategyqa" / "knowledge_base.json"
    if not path.exists():
        raise DataError("StrategyQA pretraining needs the toy world's StrategyQA (toy.sizes.strategyqa)", str(path),
                        None, "toy.pretrain.domains")  # fmt: skip
    return [toy_strategyqa.Creature(**row) for row in json.loads(path.read_text())]


def token_stream(tokenizer: Any, texts: list[str]) -> list[int]:
    """The texts' tokens end to end, each followed by the pad token (<|endoftext|> in the toy
    tokenizer), as documents are packed in pretraining."""
    separator = tokenizer.pad_token_id
    stream: list[int] = []
    for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        stream += [*ids, separator]
    return stream


def pretrain(
    model: Any,
    tokenizer: Any,
    texts: list[str],
    steps: int,
    seed: int,
    lr: float = 3e-3,
    batch_size: int = 32,
    seq_len: int = 128,
) -> list[float]:
    """`steps` AdamW steps of next-token loss on windows of `seq_len` tokens cut at random places
    of the packed texts (linear warm-up over 5% of the steps, then cosine to zero); returns the
    loss of every step. Same seed, same texts, same weights (on a CPU)."""
    import torch
    from tqdm import tqdm

    stream = torch.tensor(token_stream(tokenizer, texts), dtype=torch.long)
    if len(stream) <= seq_len:
        raise DataError(
            f"the pretraining text has {len(stream)} tokens, fewer than one window of {seq_len}",
            None,
            None,
            "toy.pretrain.documents",
        )
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warmup = max(1, steps // 20)

    def rate(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    model.train()
    losses = []
    for _ in tqdm(range(steps), desc="pretrain", unit="step", mininterval=10):
        starts = torch.randint(0, len(stream) - seq_len, (batch_size,), generator=generator)
        windows = torch.stack([stream[s : s + seq_len] for s in starts.tolist()])  # [B, T]
        loss = model(input_ids=windows, labels=windows).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses
