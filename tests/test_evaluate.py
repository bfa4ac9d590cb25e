"""Evaluation through lm-eval on a tiny model: agreement with the checker, majority vote, bad input."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

from meml.core.answers import answers_match, extract
from meml.core.io import DataError
from meml.core.records import read_records
from meml.data.experts import DEFAULT_PROMPTS
from meml.data.tiny_models import build_tiny_models, toy_corpus
from meml.evaluation.complementarity import complementarity, sample_correctness
from meml.evaluation.evaluate import evaluate, majority_vote
from meml.evaluation.lm_tasks import TASKS_DIR, expected_files


@pytest.fixture(scope="module")
def model(small_world: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("eval_models")
    return build_tiny_models(toy_corpus(small_world, DEFAULT_PROMPTS), out, seed=0, vocab_size=500)["llama"]


def test_committed_task_files_match_the_generator() -> None:
    for name, text in expected_files().items():
        assert (TASKS_DIR / name).read_text() == text, f"{name} is stale: run python -m meml.evaluation.lm_tasks"


def test_majority_vote_tie_rule() -> None:
    assert majority_vote(["3", "4", "4"]) == "4"
    assert majority_vote(["3", "4", "5"]) == "3"  # three-way tie: the lowest-numbered expert
    assert majority_vote([None, "4", "5"]) == "4"  # invalid answers do not vote
    assert majority_vote([None, None, None]) is None


def test_lm_eval_accuracy_equals_the_checker_on_the_same_generations(
    small_world: Path, model: Path, tmp_path: Path
) -> None:
    report = evaluate(
        model, "mathqa", [0, 1], small_world / "data", tmp_path / "eval.json", limit=6, batch_size=6, max_new_tokens=24
    )
    block = report["model"]
    assert block["questions"] == 6 and set(block["experts"]) == {"e0", "e1"}
    wanted = read_records(small_world / "data/mathqa/test.jsonl")[:6]  # the files it was pointed at
    assert [(q["id"], q["gold"]) for q in block["samples"]] == [(r.id, r.answer) for r in wanted]
    for name, e in block["experts"].items():
        # lm-eval scores every response; ours scores a cut one wrong: the two differ by exactly the
        # correct-looking answers that were cut
        for mode in ("strict", "lenient"):
            direct = sum(q[name][f"{mode}_correct"] for q in block["samples"]) / 6
            assert e[mode] == pytest.approx(direct)
            assert e["lm_eval"][mode] == pytest.approx(direct + e["cut_correct_looking"][mode] / 6)
        for q in block["samples"]:
            if not q[name]["finished"]:
                assert q[name]["strict"] is None and q[name]["lenient"] is None
                assert not q[name]["strict_correct"] and not q[name]["lenient_correct"]
        assert e["finished"] == pytest.approx(sum(q[name]["finished"] for q in block["samples"]) / 6)
        assert e["seconds_per_100_questions"] > 0
        assert 0 <= e["finished"] <= 1
    assert all("e0" in q and "e1" in q and "majority_vote_strict" in q for q in block["samples"])
    for mode in ("strict", "lenient"):  # the vote in each mode, from that mode's predictions
        by_hand = sum(
            answers_match(majority_vote([q["e0"][mode], q["e1"][mode]]), q["gold"], "mathqa") for q in block["samples"]
        )
        assert block["majority_vote"][mode] == pytest.approx(by_hand / 6)
    assert (tmp_path / "eval.json").is_file()
    # an evaluation of the old format (cut answers scored), scored again from its stored responses,
    # is what evaluating today gives
    from transformers import AutoTokenizer

    from meml.evaluation.evaluate import rescore

    old = copy.deepcopy(block)
    for name, e in old["experts"].items():
        old["experts"][name] = {"strict": e["lm_eval"]["strict"], "lenient": e["lm_eval"]["lenient"], "seconds": 1.0}
    for q in old["samples"]:
        for name in ("e0", "e1"):
            response = q[name]["response"]
            q[name] = {"response": response, "strict": extract(response, "mathqa", "strict", None)}
    again = rescore(old, wanted, 24, AutoTokenizer.from_pretrained(model))
    assert again["samples"] == block["samples"] and again["majority_vote"] == block["majority_vote"]
    for name, e in block["experts"].items():
        assert {k: again["experts"][name][k] for k in e if k in again["experts"][name] and k != "seconds"} == {
            k: v for k, v in e.items() if k in again["experts"][name] and k != "seconds"
        }


def test_bad_input_fails_before_generation(small_world: Path, model: Path, tmp_path: Path) -> None:
    data = small_world / "data"
    with pytest.raises(DataError, match="checkpoint folder not found"):
        evaluate(tmp_path / "nope", "gsm8k", [0], data, tmp_path / "x.json")
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "model").mkdir()
    for f in model.iterdir():
        (run / "model" / f.name).write_bytes(f.read_bytes())
    with pytest.raises(DataError, match="has not finished"):
        evaluate(run / "model", "gsm8k", [0], data, tmp_path / "x.json")
    with pytest.raises(DataError, match="unknown expert 7"):
        evaluate(model, "gsm8k", [7], data, tmp_path / "x.json")
    empty = tmp_path / "empty"
    (empty / "gsm8k").mkdir(parents=True)
    (empty / "gsm8k" / "test.jsonl").write_text("")
    with pytest.raises(DataError, match="file is empty"):
        evaluate(model, "gsm8k", [0], empty, tmp_path / "x.json")
    no_template = tmp_path / "no_template"
    no_template.mkdir()
    for f in model.iterdir():
        if f.name != "chat_template.jinja":
            (no_template / f.name).write_bytes(f.read_bytes())
    with pytest.raises(DataError, match="no chat template"):
        evaluate(no_template, "gsm8k", [0], data, tmp_path / "x.json")
    assert not (tmp_path / "x.json").exists()


def test_complementarity_statistics_by_hand() -> None:
    # 2 questions, 2 experts, 2 draws. correct[q, e, j]
    correct = torch.tensor(
        [
            [[True, False], [False, False]],  # q0: e0 right in draw 0 only; e1 always wrong
            [[False, False], [True, True]],  # q1: e0 always wrong; e1 always right
        ]
    )
    s = complementarity(correct, [0, 1])
    assert s["error_rate"] == {"e0": 0.75, "e1": 0.5}
    assert s["all_wrong"] == 0.25  # q0 draw 1
    assert s["all_wrong_among_wrong"] == pytest.approx(round(1 / 4, 4))  # every (q, j) has someone wrong
    assert s["at_least_one_correct"] == 0.75
    assert s["solved_by_another"] == {"e0": round(2 / 3, 4), "e1": 0.5}
    assert s["pass_at_k"] == {"e0": 0.5, "e1": 0.5} and s["pass_at_k_pooled"] == 1.0
    assert s["patterns"] == {"none": 0.0, "e1": 0.25, "e0": 0.5, "e0+e1": 0.25}


def test_vllm_backend_without_vllm_is_a_clear_error(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from meml.evaluation.evaluate import _make_model

    monkeypatch.setitem(sys.modules, "vllm", None)  # vLLM absent: its import fails
    with pytest.raises(DataError, match=r"needs vLLM.*scripts/setup\.sh"):
        _make_model(model, "vllm", 8, "cuda", "bfloat16")
    with pytest.raises(DataError, match="unknown evaluation backend"):
        _make_model(model, "tgi", 8, "cpu", "float32")


def test_complementarity_samples_one_model_per_expert_when_given_three(small_world: Path, model: Path) -> None:
    from meml.training.rollout import Sampling

    data = small_world / "data/gsm8k/test.jsonl"
    args = ([0, 1, 2], 2, Sampling(max_new_tokens=8, temperature=1.0))
    mef = sample_correctness(model, data, *args, limit=4, seed=3)
    # the same model given three times (the paper's reading: a model per expert) draws the same samples
    per_expert = sample_correctness([model, model, model], data, *args, limit=4, seed=3)
    assert torch.equal(mef, per_expert) and mef.shape == (4, 3, 2)
    with pytest.raises(DataError, match="2 models for 3 experts"):
        sample_correctness([model, model], data, *args, limit=4)


def test_complementarity_command_writes_json_and_figures(
    small_world: Path, model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from meml.cli import main

    out = tmp_path / "comp" / "gsm8k"
    args = [
        "complementarity",
        "--checkpoint",
        str(model),
        "--dataset",
        "gsm8k",
        "--data-root",
        str(small_world / "data"),
        "--limit",
        "3",
        "--set",
        "rl.max_new_tokens=4",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    stats = json.loads(out.with_suffix(".json").read_text())
    assert stats["questions"] == 3 and stats["samples_per_expert"] == 4  # analysis.complementarity.samples
    assert out.with_suffix(".png").stat().st_size > 0 and out.with_suffix(".pdf").stat().st_size > 0
    assert '"error_rate"' in capsys.readouterr().out


def test_eval_command_takes_backend_and_batch_from_config(
    small_world: Path, model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from meml.cli import main

    out = tmp_path / "eval.json"
    args = [
        "eval",
        "--checkpoint",
        str(model),
        "--dataset",
        "strategyqa",
        "--experts",
        "1",
        "--data-root",
        str(small_world / "data"),
        "--limit",
        "2",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    report = json.loads(out.read_text())["model"]
    assert report["backend"] == "kv" and report["questions"] == 2 and "majority_vote" not in report
    monkeypatch.setitem(sys.modules, "vllm", None)  # vLLM absent: a clear error, exit 2
    assert main([*args[:-2], "--set", "eval.backend=vllm", "--out", str(out)]) == 2
