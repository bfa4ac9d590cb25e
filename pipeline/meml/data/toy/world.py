"""Build the toy world: raw files in the real data sets' formats, read back through the real
loaders into prepared records, plus the three expert trajectory sets for the training split.

Layout under `root`:
    raw/<ds>/...                the synthetic "original" files (GSM8K jsonl, StrategyQA and MathQA json)
    data/<ds>/{train,test}.jsonl prepared records (the one normalised format)
    data/<ds>/difficulty.json    record id -> difficulty (number of reasoning steps, plus one for big numbers)
    experts/<ds>/e{0,1,2}.jsonl  expert trajectories for the training questions (e3, e4 as well
                                 when the world has 4 or 5 experts: toy/styles.py)

Same seed, same sizes -> byte-identical files.
"""

from __future__ import annotations

import json
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meml.core.io import DataError, atomic_write_json, atomic_write_jsonl, atomic_write_text
from meml.core.records import DATASETS, Record, write_records
from meml.data.experts import write_trajectories
from meml.data.loaders import load_local
from meml.data.toy import gsm8k as toy_gsm8k
from meml.data.toy import mathqa as toy_mathqa
from meml.data.toy import strategyqa as toy_strategyqa
from meml.data.toy.styles import render_e3, render_e4

Renderer = Callable[[Record], tuple[str, str, int]]  # record -> (E1, E2, difficulty)


def _write_gsm8k(
    raw: Path, rng: random.Random, style_rng: random.Random, n_train: int, n_test: int, max_ops: int | None = None
) -> Renderer:
    items = toy_gsm8k.generate(rng, n_train + n_test, max_ops)
    atomic_write_jsonl(raw / "train.jsonl", [row for row, _ in items[:n_train]])
    atomic_write_jsonl(raw / "test.jsonl", [row for row, _ in items[n_train:]])
    by_text = {p.question: p for _, p in items}

    def render(record: Record) -> tuple[str, str, int]:
        p = by_text[record.question]
        return toy_gsm8k.render_e1(p), toy_gsm8k.render_e2(p, style_rng), p.difficulty

    return render


def _write_strategyqa(
    raw: Path,
    rng: random.Random,
    style_rng: random.Random,
    n_train: int,
    n_test: int,
    kb: list[toy_strategyqa.Creature] | None = None,
    per_kind: bool = False,
) -> Renderer:
    items, kb = toy_strategyqa.generate(rng, n_train + n_test, kb, per_kind)
    rows = [row for row, _ in items]
    # Official layout: train.json + dev.json together are the labelled set; the loader splits it.
    cut = len(rows) * 9 // 10
    atomic_write_text(raw / "train.json", json.dumps(rows[:cut], indent=1) + "\n")
    atomic_write_text(raw / "dev.json", json.dumps(rows[cut:], indent=1) + "\n")
    atomic_write_json(raw / "knowledge_base.json", [vars(c) for c in kb])
    by_text = {q.text: q for _, q in items}

    def render(record: Record) -> tuple[str, str, int]:
        q = by_text[record.question]
        return toy_strategyqa.render_e1(q), toy_strategyqa.render_e2(q, style_rng), q.difficulty

    return render


def _write_mathqa(
    raw: Path, rng: random.Random, style_rng: random.Random, n_train: int, n_test: int, small: bool = False
) -> Renderer:
    items = toy_mathqa.generate(rng, n_train + n_test, small)
    atomic_write_text(raw / "train.json", json.dumps([it[0] for it in items[:n_train]], indent=4) + "\n")
    atomic_write_text(raw / "test.json", json.dumps([it[0] for it in items[n_train:]], indent=4) + "\n")
    by_text = {p.text: (p, options, correct) for _, p, options, correct in items}

    def render(record: Record) -> tuple[str, str, int]:
        p, options, correct = by_text[record.question]
        return (
            toy_mathqa.render_e1(p, options, correct),
            toy_mathqa.render_e2(p, options, correct, style_rng),
            p.difficulty,
        )

    return render


WRITERS = {"gsm8k": _write_gsm8k, "strategyqa": _write_strategyqa, "mathqa": _write_mathqa}


def _generate(
    root: Path,
    dataset: str,
    name: str,
    n_train: int,
    n_test: int,
    gsm8k_max_ops: int | None,
    mathqa_small: bool,
    kb: list[toy_strategyqa.Creature] | None = None,
    strategyqa_per_kind: bool = False,
) -> tuple[list[Record], Renderer]:
    """Draw one data set from the random streams called `name`, write its raw files under root/raw/
    and read them back through the real loader: (records, their expert renderer)."""
    rng = random.Random(f"toy-{name}-{dataset}")
    style_rng = random.Random(f"toy-{name}-{dataset}-styles")
    raw = root / "raw" / dataset
    if dataset == "gsm8k":
        render = _write_gsm8k(raw, rng, style_rng, n_train, n_test, gsm8k_max_ops)
    elif dataset == "mathqa":
        render = _write_mathqa(raw, rng, style_rng, n_train, n_test, mathqa_small)
    else:
        render = _write_strategyqa(raw, rng, style_rng, n_train, n_test, kb, strategyqa_per_kind)
    return load_local(dataset, raw, strategyqa_test_size=n_test), render


def _knowledge_base(root: Path) -> list[toy_strategyqa.Creature]:
    rows = json.loads((root / "raw" / "strategyqa" / "knowledge_base.json").read_text())
    return [toy_strategyqa.Creature(**row) for row in rows]


def _drawn_train(
    root: Path,
    dataset: str,
    seed: int,
    draw: int,
    n_train: int,
    n_test: int,
    max_ops: int | None,
    small: bool,
    per_kind: bool = False,
) -> tuple[list[Record], list[Record], Renderer, Renderer]:
    """A grid seed's own training questions beside the world's test set: (train, test, the train
    renderer, the test renderer). The test questions and StrategyQA's knowledge base are the
    world's (seed `seed`); the training questions and the experts' wording are drawn from streams
    of their own (`draw`), never repeating a test question: n_train + n_test training questions are
    drawn and the first n_train that are not test questions are kept."""
    with tempfile.TemporaryDirectory() as folder:
        world, world_render = _generate(
            Path(folder), dataset, str(seed), n_train, n_test, max_ops, small, None, per_kind
        )
        kb = _knowledge_base(Path(folder)) if dataset == "strategyqa" else None
    test = [r for r in world if r.split == "test"]
    held_out = {r.question for r in test}
    drawn, render = _generate(
        root, dataset, f"{seed}-draw{draw}", n_train + n_test, n_test, max_ops, small, kb, per_kind
    )
    train = [r for r in drawn if r.split == "train" and r.question not in held_out][:n_train]
    if len(train) < n_train:
        raise DataError(
            f"toy {dataset}: only {len(train)} training questions outside the test set, {n_train} asked for",
            None, None, f"toy.sizes.{dataset}",
        )  # fmt: skip
    if kb is not None:  # the world's creatures (the draw wrote the same ones): pretraining reads them
        atomic_write_json(root / "raw" / "strategyqa" / "knowledge_base.json", [vars(c) for c in kb])
    return train, test, render, world_render


def build_dataset(
    root: str | Path,
    dataset: str,
    seed: int,
    n_train: int,
    n_test: int,
    n_experts: int = 3,
    gsm8k_max_ops: int | None = None,
    mathqa_small: bool = False,
    draw: int | None = None,
    whole: bool = False,
    strategyqa_per_kind: bool = False,
) -> dict[str, Any]:
    """Generate one toy data set and its expert trajectories; returns a small summary. With `draw`
    (grid.seeds_vary: data) the training questions and trajectories are that draw's own and the
    test questions the world's (see _drawn_train); with `whole` too (grid.seeds_vary: world) the
    draw is a world of its own: its test questions and StrategyQA's creatures as well."""
    root = Path(root)
    if draw is None or whole:
        name = str(seed) if draw is None else f"{seed}-world{draw}"
        records, render = _generate(
            root, dataset, name, n_train, n_test, gsm8k_max_ops, mathqa_small, None, strategyqa_per_kind
        )
        train = [r for r in records if r.split == "train"]
        test = [r for r in records if r.split == "test"]
    else:
        train, test, render, test_render = _drawn_train(
            root, dataset, seed, draw, n_train, n_test, gsm8k_max_ops, mathqa_small, strategyqa_per_kind
        )
        records = train + test
        train_render = render

        def render(record: Record) -> tuple[str, str, int]:
            return (train_render if record.split == "train" else test_render)(record)

    data = root / "data" / dataset
    write_records(data / "train.jsonl", train)
    write_records(data / "test.jsonl", test)
    difficulty: dict[str, int] = {}
    e1, e2 = [], []
    for record in records:
        text1, text2, level = render(record)
        difficulty[record.id] = level
        if record.split == "train":
            e1.append((record, text1))
            e2.append((record, text2))
    atomic_write_json(data / "difficulty.json", difficulty)
    experts = root / "experts" / dataset
    write_trajectories(experts / "e0.jsonl", 0, [(r, r.rationale) for r in train], "dataset rationale")
    write_trajectories(experts / "e1.jsonl", 1, e1, "toy generator, long chain (R1 style)")
    write_trajectories(experts / "e2.jsonl", 2, e2, "toy generator, reflective (Doubao style)")
    extra = {3: (render_e3, "numbered reference steps"), 4: (render_e4, "answer first, then the steps")}
    if not 1 <= n_experts <= 5:
        raise DataError(f"the toy world has 1 to 5 expert styles, not {n_experts}", None, None, "experts.count")
    for k in range(3, n_experts):
        render_k, source = extra[k]
        write_trajectories(experts / f"e{k}.jsonl", k, [(r, render_k(r)) for r in train], f"toy generator, {source}")
    for k in range(max(n_experts, 3), 5):
        (experts / f"e{k}.jsonl").unlink(missing_ok=True)  # a smaller world must not keep a bigger one's files
    return {"dataset": dataset, "train": len(train), "test": len(test)}


def build_world(
    root: str | Path,
    seed: int,
    sizes: dict[str, tuple[int, int]],
    n_experts: int = 3,
    gsm8k_max_ops: int | None = None,
    mathqa_small: bool = False,
    draw: int | None = None,
    drawn: tuple[str, ...] = (),
    whole: bool = False,
    strategyqa_per_kind: bool = False,
) -> list[dict[str, Any]]:
    """Every data set of `sizes`; with `draw`, the data sets in `drawn` get that draw's own
    training questions, or with `whole` a world of their own (a grid seed's world: build_dataset),
    the others are the world's."""
    return [
        build_dataset(
            root,
            ds,
            seed,
            *sizes[ds],
            n_experts,
            gsm8k_max_ops,
            mathqa_small,
            draw if ds in drawn else None,
            whole,
            strategyqa_per_kind,
        )
        for ds in DATASETS
        if ds in sizes
    ]
