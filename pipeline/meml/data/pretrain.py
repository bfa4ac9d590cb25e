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

`toy.pretrain.steps: 0` (the default) skips it: the default grid's models stay random.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterable
from typing import Any

from meml.core.io import DataError
from meml.data.toy import gsm8k as toy_gsm8k


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
    exclude: Iterable[str], seed: int, documents: int, max_ops: int | None = None, fact_share: float = 0.3
) -> list[str]:
    """`documents` texts: a `fact_share` of them lines of arithmetic facts, the rest fresh toy
    GSM8K problems followed by a worked solution in a style drawn at random (the prepared data
    set's terse one, without calculator notes, or expert 1's or expert 2's); questions in
    `exclude` are skipped."""
    rng = random.Random(f"pretrain-{seed}")
    excluded = set(exclude)
    texts: list[str] = []
    while len(texts) < documents:
        if rng.random() < fact_share:
            texts.append("\n".join(arithmetic_fact(rng) for _ in range(8)))
            continue
        problem = toy_gsm8k.make_problem(rng, max_ops)
        if problem.question in excluded:
            continue
        style = rng.randrange(3)
        if style == 0:
            solution = re.sub(r"<<.*?>>", "", toy_gsm8k.render_e0(problem))  # as the loader prepares it
        elif style == 1:
            solution = toy_gsm8k.render_e1(problem)
        else:
            solution = toy_gsm8k.render_e2(problem, rng)
        texts.append(f"{problem.question}\n{solution}")
    return texts


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
