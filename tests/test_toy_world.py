"""The toy world: determinism, formats, expert styles that differ, and a real difficulty range."""

from __future__ import annotations

import filecmp
import json
from pathlib import Path

from meml.core.answers import is_correct
from meml.core.records import read_records
from meml.data.experts import read_trajectories
from meml.data.toy.stats import world_stats
from meml.data.toy.strategyqa import kind_of
from meml.data.toy.world import build_world

SIZES = {"gsm8k": (40, 10), "strategyqa": (40, 10), "mathqa": (40, 10)}


def _files(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())


def test_same_seed_gives_byte_identical_files(tmp_path: Path) -> None:
    build_world(tmp_path / "a", 3, SIZES)
    build_world(tmp_path / "b", 3, SIZES)
    build_world(tmp_path / "c", 4, SIZES)
    files = _files(tmp_path / "a")
    # per data set: 3 prepared files, 3 trajectory sets; raw: 2 (GSM8K), 3 (StrategyQA with its facts), 2 (MathQA)
    assert files == _files(tmp_path / "b") and len(files) == 3 * 3 + 3 * 3 + 2 + 3 + 2
    _match, mismatch, errors = filecmp.cmpfiles(tmp_path / "a", tmp_path / "b", files, shallow=False)
    assert not mismatch and not errors
    assert (tmp_path / "a" / "data/gsm8k/train.jsonl").read_bytes() != (
        tmp_path / "c" / "data/gsm8k/train.jsonl"
    ).read_bytes()


def test_raw_files_are_in_the_real_formats(small_world: Path) -> None:
    gsm = json.loads((small_world / "raw/gsm8k/train.jsonl").read_text().splitlines()[0])
    assert set(gsm) == {"question", "answer"} and "<<" in gsm["answer"] and "\n#### " in gsm["answer"]
    sqa = json.loads((small_world / "raw/strategyqa/train.json").read_text())[0]
    assert {"qid", "question", "answer", "facts", "decomposition"} <= set(sqa) and isinstance(sqa["answer"], bool)
    mqa = json.loads((small_world / "raw/mathqa/train.json").read_text())[0]
    assert set(mqa) == {"Problem", "Rationale", "options", "correct", "annotated_formula", "linear_formula", "category"}
    assert mqa["options"].startswith("a ) ") and mqa["correct"] in "abcde"


def test_every_trajectory_is_judged_correct_and_styles_differ(small_world: Path) -> None:
    for ds in ("gsm8k", "strategyqa", "mathqa"):
        records = {r.id: r for r in read_records(small_world / f"data/{ds}/train.jsonl")}
        texts = {}
        for k in range(3):
            triples = read_trajectories(small_world / f"experts/{ds}/e{k}.jsonl", records)
            assert len(triples) == len(records)
            for record, expert, completion in triples:
                assert expert == k
                assert is_correct(completion, ds, record.answer, "strict", record.options)
            texts[k] = [c for _, _, c in triples]
        assert all("<think>" in t and "</think>" in t for t in texts[1])
        assert not any("<think>" in t for t in texts[0] + texts[2])
        # E2 re-checks; at least some of its trajectories catch and correct a slip
        assert sum(("check" in t.lower()) for t in texts[2]) == len(texts[2])
        assert any(w in " ".join(texts[2]).lower() for w in ("wait", "hmm"))
        mean = {k: sum(len(t.split()) for t in v) / len(v) for k, v in texts.items()}
        assert mean[1] > mean[0] and mean[2] > mean[0]


def test_difficulty_range_and_balance(small_world: Path) -> None:
    stats = world_stats(small_world)
    assert set(stats) == {"gsm8k", "strategyqa", "mathqa"}
    for ds, s in stats.items():
        assert (s["train"], s["test"]) == (60, 20)
        assert len(s["difficulty"]) >= 3, ds  # easy and hard questions alike
    assert stats["strategyqa"]["answers"] == {"no": 40, "yes": 40}
    assert len(stats["mathqa"]["answers"]) == 5


def test_five_expert_world_adds_two_distinct_checked_styles(tmp_path: Path) -> None:
    from meml.data.toy.styles import render_e3, render_e4

    build_world(tmp_path, 0, SIZES, n_experts=5)
    for ds in SIZES:
        records = {r.id: r for r in read_records(tmp_path / "data" / ds / "train.jsonl")}
        e0 = {r.id: c for r, _, c in read_trajectories(tmp_path / "experts" / ds / "e0.jsonl", records)}
        for k, render in ((3, render_e3), (4, render_e4)):
            rows = read_trajectories(tmp_path / "experts" / ds / f"e{k}.jsonl", records)
            assert len(rows) == len(records)
            for record, expert, completion in rows:
                assert expert == k and completion == render(record) and completion != e0[record.id]
                assert is_correct(completion, ds, record.answer, "strict", record.options)
        record = next(iter(records.values()))
        assert render_e3(record).startswith("1. ") and render_e4(record).startswith("I expect the answer to be")
    # a 3-expert world built over it removes the extra styles again
    build_world(tmp_path, 0, SIZES)
    assert not (tmp_path / "experts" / "gsm8k" / "e3.jsonl").exists()


def test_gsm8k_max_ops_caps_the_chain_and_leaves_the_default_alone() -> None:
    import random

    from meml.data.toy import gsm8k

    short = gsm8k.generate(random.Random(3), 200, max_ops=1)
    assert all(sum(not s.side for s in p.steps) == 1 for _, p in short)
    mixed = gsm8k.generate(random.Random(3), 200)
    assert max(sum(not s.side for s in p.steps) for _, p in mixed) == 5
    assert [row for row, _ in gsm8k.generate(random.Random(3), 200, max_ops=5)] == [row for row, _ in mixed]


def test_gsm8k_solutions_never_restate_the_persons_name() -> None:
    """The person's name decides nothing, and a tiny model does not learn to copy it from the
    question: restated in a solution it is a guess among twelve names, most of the sampled policy's
    entropy and none of the reward, so GRPO's gradient on it is noise (docs/toy-world.md). The
    question keeps the name; no expert's solution repeats it."""
    import random

    from meml.data.toy import gsm8k
    from meml.data.toy.gsm8k import NAMES

    for row, p in gsm8k.generate(random.Random(5), 300):
        assert p.person in row["question"]
        for text in (gsm8k.render_e0(p), gsm8k.render_e1(p), gsm8k.render_e2(p, random.Random(0))):
            assert not any(name in text for name in NAMES), text


def test_mathqa_small_numbers_are_one_digit_facts_and_too_many_is_an_error() -> None:
    import random
    import re

    import pytest

    from meml.core.answers import is_correct
    from meml.core.io import DataError
    from meml.data.toy import mathqa

    small = mathqa.generate(random.Random(3), 600, small=True)
    for _row, problem, options, correct in small:
        # every number of the question is at most three significant digits followed by zeros
        assert all(len(n.rstrip("0")) <= 3 for n in re.findall(r"\d+", problem.text)), problem.text
        assert is_correct(mathqa.render_e1(problem, options, correct), "mathqa", correct, "strict", options)
        assert options[correct].removesuffix(problem.unit) == mathqa._f(problem.value)
    big = mathqa.generate(random.Random(3), 600)
    assert max(int(n) for _, p, _, _ in big for n in re.findall(r"\d+", p.text)) > 1000
    with pytest.raises(DataError, match=r"toy\.sizes\.mathqa.*fewer than the 2000 asked for"):
        mathqa.generate(random.Random(3), 2000, small=True)


def test_a_seed_world_draws_its_own_training_data_beside_the_shared_test_set(tmp_path: Path) -> None:
    build_world(tmp_path / "world", 0, SIZES)
    for k in (1, 2):
        build_world(tmp_path / f"seed{k}", 0, SIZES, draw=k, drawn=("gsm8k", "strategyqa"))
    build_world(tmp_path / "again", 0, SIZES, draw=1, drawn=("gsm8k", "strategyqa"))
    files = _files(tmp_path / "seed1")
    assert files == _files(tmp_path / "again")
    _match, mismatch, errors = filecmp.cmpfiles(tmp_path / "seed1", tmp_path / "again", files, shallow=False)
    assert not mismatch and not errors  # the same draw, byte for byte

    def questions(world: str, ds: str, split: str) -> list[str]:
        return [r.question for r in read_records(tmp_path / world / "data" / ds / f"{split}.jsonl")]

    for ds in ("gsm8k", "strategyqa"):
        test = questions("world", ds, "test")
        trains = [questions(w, ds, "train") for w in ("world", "seed1", "seed2")]
        assert all(len(t) == SIZES[ds][0] for t in trains)
        for world in ("seed1", "seed2"):
            assert questions(world, ds, "test") == test  # the methods are still compared on the same questions
            assert not set(questions(world, ds, "train")) & set(test)
        assert len({tuple(t) for t in trains}) == 3  # each seed its own draw
        trajectories = [(tmp_path / w / "experts" / ds / "e2.jsonl").read_text() for w in ("world", "seed1")]
        assert trajectories[0] != trajectories[1]
    kb = [(tmp_path / w / "raw/strategyqa/knowledge_base.json").read_text() for w in ("world", "seed1", "seed2")]
    assert kb[0] == kb[1] == kb[2]  # the creatures the test questions ask about
    for name in ("train.jsonl", "test.jsonl"):  # a data set not drawn is the world's
        assert filecmp.cmp(tmp_path / "world/data/mathqa" / name, tmp_path / "seed1/data/mathqa" / name, shallow=False)


def test_a_seed_world_of_its_own_draws_its_test_questions_and_creatures_too(tmp_path: Path) -> None:
    """grid.seeds_vary: world: seed k's world is drawn whole (train, test and StrategyQA's knowledge
    base) from a stream of its own, the same on every build, and its questions are answerable: each
    test question is about the seed's own creatures."""
    drawn = ("gsm8k", "strategyqa")
    build_world(tmp_path / "world", 0, SIZES)
    for k in (1, 2):
        build_world(tmp_path / f"seed{k}", 0, SIZES, draw=k, drawn=drawn, whole=True)
    build_world(tmp_path / "again", 0, SIZES, draw=1, drawn=drawn, whole=True)
    files = _files(tmp_path / "seed1")
    _match, mismatch, errors = filecmp.cmpfiles(tmp_path / "seed1", tmp_path / "again", files, shallow=False)
    assert not mismatch and not errors

    def questions(world: str, ds: str, split: str) -> list[str]:
        return [r.question for r in read_records(tmp_path / world / "data" / ds / f"{split}.jsonl")]

    for ds in drawn:
        tests = [questions(w, ds, "test") for w in ("world", "seed1", "seed2")]
        assert all(len(t) == SIZES[ds][1] for t in tests)
        assert len({tuple(t) for t in tests}) == 3  # each seed its own test questions
        for world in ("seed1", "seed2"):
            assert not set(questions(world, ds, "train")) & set(questions(world, ds, "test"))
    kbs = [json.loads((tmp_path / w / "raw/strategyqa/knowledge_base.json").read_text()) for w in ("world", "seed1")]
    assert kbs[0] != kbs[1]  # other creatures
    names = {c["name"] for c in kbs[1]}
    for question in questions("seed1", "strategyqa", "test"):
        assert any(name in question for name in names), question
    for name in ("train.jsonl", "test.jsonl"):  # a data set not drawn is still the world's
        assert filecmp.cmp(tmp_path / "world/data/mathqa" / name, tmp_path / "seed1/data/mathqa" / name, shallow=False)


def _majority_by_kind(train: list[tuple[str, bool]], test: list[tuple[str, bool]]) -> float:
    """The test accuracy of answering each kind of question with its majority answer in `train`."""
    yes: dict[str, int] = {}
    seen: dict[str, int] = {}
    for question, answer in train:
        kind = kind_of(question)
        yes[kind], seen[kind] = yes.get(kind, 0) + answer, seen.get(kind, 0) + 1
    return sum((2 * yes[kind_of(q)] >= seen[kind_of(q)]) == a for q, a in test) / len(test)


def test_strategyqa_per_kind_leaves_no_answer_in_the_wording() -> None:
    """Drawn freely, the kinds of question lean one way each, so answering each kind's majority
    answer scores well above a guess without a fact recalled; balanced within kinds
    (toy.strategyqa_per_kind) each kind is answered yes and no equally often and the same rule
    scores a guess. The default draw is left as it was."""
    import random

    from meml.data.toy import strategyqa

    def drawn(seed: int, count: int, kb: object = None, per_kind: bool = False) -> tuple[list, list]:
        items, kb = strategyqa.generate(random.Random(seed), count, kb, per_kind)  # type: ignore[arg-type]
        return [(q.text, q.answer) for _, q in items], kb

    free, kb = drawn(11, 1000)
    free_test, _ = drawn(12, 500, kb)
    assert _majority_by_kind(free, free_test) > 0.62
    balanced, kb = drawn(11, 1000, per_kind=True)
    balanced_test, _ = drawn(12, 500, kb, per_kind=True)
    assert 0.45 < _majority_by_kind(balanced, balanced_test) < 0.55
    by_kind: dict[str, list[int]] = {}
    for question, answer in balanced:
        by_kind.setdefault(kind_of(question), [0, 0])[answer] += 1
    # within a few: once one answer's overall half is full, the other is drawn whatever the kind
    assert len(by_kind) == 6 and all(abs(no - yes) <= 3 for no, yes in by_kind.values()), by_kind
    assert sum(a for _, a in balanced) == 500  # and yes/no overall, exactly, as before
    # a kind with too few distinct questions of one answer fills up and the others take the rest
    many, _ = drawn(11, 3000, per_kind=True)
    counts: dict[str, list[int]] = {}
    for question, answer in many:
        counts.setdefault(kind_of(question), [0, 0])[answer] += 1
    assert len({q for q, _ in many}) == 3000 and all(abs(no - yes) <= 3 for no, yes in counts.values()), counts
    # the default draw consumes the random stream as it did: the same questions as make_question alone
    rng = random.Random(7)
    kb = strategyqa.knowledge_base(rng)
    again = random.Random(7)
    strategyqa.knowledge_base(again)
    assert [strategyqa.make_question(rng, kb).text for _ in range(50)] == [
        strategyqa._question(again.choice(strategyqa.KINDS), *again.sample(kb, 3)).text for _ in range(50)
    ]


def test_the_per_kind_switch_reaches_every_way_a_world_is_drawn(tmp_path: Path) -> None:
    """The world's own data set, a seed's training draw beside the world's test set, and a seed's
    world of its own: each balanced within kinds."""
    sizes = {"strategyqa": (300, 100)}
    worlds = {
        "world": {},
        "draw": {"draw": 1, "drawn": ("strategyqa",)},
        "own": {"draw": 1, "drawn": ("strategyqa",), "whole": True},
    }
    for name, how in worlds.items():
        build_world(tmp_path / name, 0, sizes, strategyqa_per_kind=True, **how)  # type: ignore[arg-type]
        data = tmp_path / name / "data" / "strategyqa"
        records = read_records(data / "train.jsonl") + read_records(data / "test.jsonl")
        answers: dict[str, list[bool]] = {}
        for r in records:
            answers.setdefault(kind_of(r.question), []).append(r.answer == "yes")
        assert len(answers) == 6
        for kind, said in answers.items():  # a draw of balanced kinds (a seed's training draw: a sample of one)
            assert abs(sum(said) / len(said) - 0.5) < 0.15, (name, kind, sum(said), len(said))
