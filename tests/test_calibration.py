"""The calibration gate: values checked against their ranges, the message that names the setting
to change, and the stop / warn behaviour on a real (untrained, so out of range) tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meml.data.experts import DEFAULT_PROMPTS
from meml.evaluation.calibration import CalibrationError, answer_balance, calibrate, check
from meml.training.rollout import Sampling

RANGES = {"rollout_success": [0.2, 0.45], "greedy_accuracy": [0.25, 0.6], "finished": [0.95, 1.0]}


def test_check_names_each_value_outside_its_range_and_what_moves_it() -> None:
    result = {
        "dataset": "gsm8k",
        "rollout_success": {"e0": 0.30, "e1": 0.05},
        "finished": {"e0": 1.0, "e1": 0.90},
        "greedy": {"expert": 1, "accuracy": 0.40},
    }
    problems = check(result, RANGES)
    assert problems == [
        "expert 1's rollout success 0.05 is outside calibration.ranges.rollout_success [0.2, 0.45]; "
        "change toy.pretrain.steps, sft.epochs, sft.lr, toy.sizes (more SFT data), rl.temperature",
        "expert 1's finished share 0.90 is outside calibration.ranges.finished [0.95, 1.0]; "
        "change rl_by_dataset.gsm8k.max_new_tokens (or rl.max_new_tokens), sft.epochs",
    ]
    result["rollout_success"]["e1"], result["finished"]["e1"] = 0.2, 0.95  # the bounds are inside
    assert check(result, RANGES) == []


def test_answer_balance_is_the_largest_class_share() -> None:
    assert answer_balance(["yes", "no", "Yes", "yes"]) == {"largest_class": "yes", "largest_share": 0.75, "classes": 2}


@pytest.fixture(scope="module")
def untrained(small_world: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from meml.data.tiny_models import build_tiny_models, toy_corpus

    out = tmp_path_factory.mktemp("calibration-models")
    return build_tiny_models(toy_corpus(small_world, DEFAULT_PROMPTS), out, seed=0, vocab_size=500)["qwen2"]


def _run(untrained: Path, small_world: Path, out: Path, gate: str) -> dict:
    return calibrate(
        out, gate, RANGES, "qwen2/gsm8k/e0-e1-e2",
        model_dir=untrained, data_root=small_world / "data", dataset="gsm8k", experts=[0, 1, 2], headline=1,
        sampling=Sampling(12, 0.7), train_questions=3, samples=2, test_questions=4,
        prompts=DEFAULT_PROMPTS, mode="lenient", seed=0,
    )  # fmt: skip


def test_gate_stop_raises_with_the_message_and_writes_no_result(
    untrained: Path, small_world: Path, tmp_path: Path
) -> None:
    out = tmp_path / "calibration" / "e0-e1-e2.json"
    with pytest.raises(CalibrationError, match=r"calibration of qwen2/gsm8k/e0-e1-e2 \(calibration.gate: stop\)"):
        _run(untrained, small_world, out, "stop")
    assert not out.exists()  # nothing half-written: RL's input is missing, so RL never starts
    note = out.with_suffix(".failed").read_text()
    assert "expert 0's rollout success 0.00 is outside calibration.ranges.rollout_success [0.2, 0.45]" in note


def test_gate_warn_writes_the_measurements(untrained: Path, small_world: Path, tmp_path: Path) -> None:
    out = tmp_path / "e0-e1-e2.json"
    result = _run(untrained, small_world, out, "warn")
    saved = json.loads(out.read_text())
    assert saved == result and saved["in_range"] is False and saved["problems"]
    # an untrained model: no correct answer, and 12 tokens are too few to finish
    assert saved["rollout_success"] == {"e0": 0.0, "e1": 0.0, "e2": 0.0}
    assert saved["greedy"] == {"expert": 1, "questions": 4, "accuracy": 0.0, "finished": saved["greedy"]["finished"]}
    assert saved["train_questions"] == 3 and saved["samples"] == 2 and saved["answer_balance"] is None
    # each expert's mean completion length, in tokens (at most the 12-token cap, at least one)
    assert set(saved["mean_tokens"]) == {"e0", "e1", "e2"} and all(1 <= v <= 12 for v in saved["mean_tokens"].values())
    assert not out.with_suffix(".failed").exists()


def test_a_data_sets_own_range_is_laid_over_the_common_one_and_named() -> None:
    from meml.core.config import load_config
    from meml.evaluation.calibration import ranges_for

    settings = {"ranges": RANGES, "ranges_by_dataset": {"strategyqa": {"rollout_success": [0.55, 0.85]}}}
    ranges, own = ranges_for(settings, "strategyqa")
    assert ranges == {**RANGES, "rollout_success": [0.55, 0.85]} and own == {"rollout_success"}
    assert ranges_for(settings, "gsm8k") == (RANGES, set())
    # a yes/no guess: in the common range, under StrategyQA's own
    result = {"dataset": "strategyqa", "rollout_success": {"e1": 0.45}, "finished": {"e1": 0.90},
              "greedy": {"expert": 1, "accuracy": 0.50}}  # fmt: skip
    assert check(result, RANGES) == [
        "expert 1's finished share 0.90 is outside calibration.ranges.finished [0.95, 1.0]; "
        "change rl_by_dataset.strategyqa.max_new_tokens (or rl.max_new_tokens), sft.epochs",
    ]
    assert check(result, ranges, own)[0] == (
        "expert 1's rollout success 0.45 is outside calibration.ranges_by_dataset.strategyqa.rollout_success "
        "[0.55, 0.85]; change toy.pretrain.steps, sft.epochs, sft.lr, toy.sizes (more SFT data), rl.temperature"
    )
    # the shipped defaults put each data set's range above its chance level
    shipped = load_config()["calibration"]
    for dataset, chance in (("strategyqa", 0.5), ("mathqa", 0.2)):
        own_ranges = ranges_for(shipped, dataset)[0]
        assert own_ranges["rollout_success"][0] > chance and own_ranges["greedy_accuracy"][0] > chance


def test_mixed_groups_count_the_questions_whose_samples_disagree(monkeypatch: pytest.MonkeyPatch) -> None:
    """By hand: expert 0 gets (right, wrong), (right, right), (wrong, wrong) on three questions, so
    one group in three has a non-zero advantage; expert 1 gets (wrong, right) twice and (right,
    wrong) once: all three. Success 3/6 and 3/6, finished 5/6 and 6/6."""
    from meml.core.records import Record
    from meml.evaluation import calibration
    from meml.training.rollout import Completion

    records = [Record(f"q{i}", "gsm8k", "train", "q", "7", "", None, "toy") for i in range(3)]
    said = {0: [("7", "8"), ("7", "7"), ("8", "8")], 1: [("8", "7"), ("8", "7"), ("7", "8")]}

    class Scripted:
        def generate(self, prompts: list, n: int, sampling: object) -> list:
            assert len(prompts) == 6 and n == 2
            texts = [pair for k in (0, 1) for pair in said[k]]
            cut = {(0, 2, 0)}  # expert 0's first sample of question 2 ran to the cap
            return [
                [Completion([1, 2], f"The answer is {t}", (k, i % 3, j) not in cut) for j, t in enumerate(pair)]
                for i, (k, pair) in enumerate(zip([0, 0, 0, 1, 1, 1], texts, strict=True))
            ]

    monkeypatch.setattr(calibration, "prompt_ids", lambda tokenizer, messages: [0])
    out = calibration._sample(Scripted(), None, records, [0, 1], 2, None, ["a", "b"], "lenient")
    assert out[0] == (3 / 6, 5 / 6, 2.0, 1 / 3)
    assert out[1] == (3 / 6, 1.0, 2.0, 1.0)
