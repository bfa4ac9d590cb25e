from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from meml.core.answers import (
    RewardConfig,
    canonical_answer_line,
    extract,
    is_correct,
    parse_number,
    reward,
    score,
)
from meml.data.loaders import parse_mathqa_options

CASES = yaml.safe_load((Path(__file__).parent / "fixtures" / "answer_cases.yaml").read_text())


@pytest.mark.parametrize("case", CASES, ids=[f"{c['ds']}-{i}" for i, c in enumerate(CASES)])
def test_tricky_case(case: dict) -> None:
    options = parse_mathqa_options(case["opts"]) if "opts" in case else None
    for mode in ("strict", "lenient"):
        got = is_correct(case["text"], case["ds"], case["gold"], mode, options)
        assert got is case[mode], f"{mode}: {case['text']!r} -> {extract(case['text'], case['ds'], mode, options)!r}"


@pytest.mark.parametrize(("dataset", "answer"), [("gsm8k", "-7"), ("strategyqa", "no"), ("mathqa", "d")])
def test_canonical_line_reads_back_strictly(dataset: str, answer: str) -> None:
    text = "some reasoning\n" + canonical_answer_line(dataset, answer)
    assert extract(text, dataset, "strict") == answer


def test_parse_number_forms() -> None:
    assert parse_number("$1,450,000.") == 1450000
    assert parse_number("- 9") == -9
    assert parse_number("13 1 / 2") == 13.5
    assert parse_number("15 / 8 ohms") == 1.875
    assert parse_number("none of these") is None


def test_reward_and_format_bonus() -> None:
    assert reward("#### 5", "gsm8k", "5") == 1.0
    assert reward("The answer is 5", "gsm8k", "5") == 1.0
    assert reward("The answer is 5", "gsm8k", "5", config=RewardConfig(mode="strict")) == 0.0
    bonus = RewardConfig(format_bonus=0.1)
    assert reward("#### 4", "gsm8k", "5", config=bonus) == pytest.approx(0.1)
    assert reward("#### 5", "gsm8k", "5", config=bonus) == pytest.approx(1.1)
    assert reward("it is 5", "gsm8k", "5", config=bonus) == pytest.approx(1.0)


def test_an_answer_cut_at_the_cap_scores_nothing() -> None:
    # the lenient checker reads "5" out of a half-written chain; cut, it is neither correct nor rewarded
    half = "First 2 + 3 = 5, then we add the"
    assert score(half, "gsm8k", "5") == (True, 1.0)
    assert score(half, "gsm8k", "5", finished=False) == (False, 0.0)
    assert score("#### 5", "gsm8k", "5", RewardConfig(format_bonus=0.1), finished=False) == (False, 0.0)


def test_unknown_mode_and_dataset_are_errors() -> None:
    with pytest.raises(ValueError, match="unknown checking mode"):
        extract("x", "gsm8k", "loose")
    with pytest.raises(ValueError, match="unknown data set"):
        extract("x", "svamp")


def test_checker_works_off_the_main_thread() -> None:
    # math-verify raises off the main thread unless its timeout is disabled; we disable it.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda t: is_correct(t, "gsm8k", "5"), ["\\boxed{\\frac{10}{2}}"] * 4))
    assert results == [True] * 4
