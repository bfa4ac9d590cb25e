"""training/trl_grpo.py: a cell trained by trl's GRPOTrainer with what our loop holds equal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from meml.core.answers import RewardConfig
from meml.core.config import load_config
from meml.core.io import DataError
from meml.core.records import read_records
from meml.data.experts import DEFAULT_PROMPTS, chat_messages
from meml.data.tiny_models import build_tiny_models, toy_corpus
from meml.plan import grid
from meml.training.groups import QuestionOrder
from meml.training.rl import Method, RLSettings
from meml.training.trl_grpo import TRLCell, expressible, question_rows, reward_function, run_trl_grpo

CONFIG = load_config()


def _cell(method: str = "Expert1-SFT-GRPO", **rl: object) -> TRLCell:
    settings = {**CONFIG["rl"], "steps": 3, "questions_per_step": 2, "group_size": 4, "max_new_tokens": 16, **rl}
    return TRLCell(RLSettings.from_config(settings), Method.from_config(method, CONFIG["methods"][method]), seed=5)


def test_the_questions_come_in_our_loops_order_under_the_rollout_experts_prompt(small_world: Path) -> None:
    records = read_records(small_world / "data/gsm8k/train.jsonl")
    rows = question_rows(records, _cell())
    order = QuestionOrder(len(records), 5)  # what run_rl builds from the cell's seed
    expected = [records[i] for _ in range(3) for i in order.take(2)]
    assert [r["id"] for r in rows] == [r.id for r in expected]
    assert rows[0]["prompt"] == chat_messages(expected[0], 1, DEFAULT_PROMPTS)  # Expert1: expert 1's prompt


def test_a_completion_cut_at_the_cap_scores_zero() -> None:
    reward = reward_function(RewardConfig(), (7,))
    said = [[{"content": "The answer is 42"}]] * 3
    got = reward(completions=said, completion_ids=[[3, 7], [3, 4], []], answer=["42"] * 3, options=["null"] * 3,
                 dataset=["gsm8k"] * 3)  # fmt: skip
    assert got == [1.0, 0.0, 0.0]  # ended with a stop token; cut; nothing at all


def test_only_what_trl_can_express_is_compared() -> None:
    assert expressible(_cell().method) is None
    assert "3 experts" in str(expressible(_cell("MoE-SFT-GRPO").method))
    assert "HSFT" in str(expressible(_cell("Expert1+HSFT").method))  # one expert, but the buffer
    assert "shuffled advantages" in str(expressible(_cell("Expert1-SFT-GRPO-shuffled").method))  # the control
    with pytest.raises(DataError, match=r"'trl\.methods\[0\]'"):
        grid.check(load_config(overrides={"trl.methods": ["MEML-GRPO"]}), 3)
    with pytest.raises(DataError, match=r"'trl\.methods\[0\]'"):
        grid.check(load_config(overrides={"trl.methods": ["GRPO-nowhere"]}), 3)
    with pytest.raises(DataError, match=r"'trl\.methods\[0\]'.*one update a batch"):
        grid.check(load_config(overrides={"trl.methods": ["Expert1-SFT-GRPO"], "rl.updates_per_batch": 2}), 3)
    grid.check(load_config(overrides={"trl.methods": ["Expert1-SFT-GRPO"]}), 3)


def test_trl_trains_the_cell_and_logs_our_metric_names(
    small_world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through trl itself: what its reward function is handed is our questions in our order, each G
    times, in micro-batches that fit rl.micro_batch_tokens; a completion ends at our stop tokens."""
    from meml.core.stops import stop_tokens
    from meml.training import trl_grpo

    model = build_tiny_models(toy_corpus(small_world, DEFAULT_PROMPTS), tmp_path / "m", seed=0, vocab_size=500)["qwen2"]
    config = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**config, "eos_token_id": 0}))  # not our stops
    seen: list[str] = []

    def recording(config: RewardConfig, stop_ids: tuple[int, ...]) -> object:
        ours = reward_function(config, stop_ids)

        def reward(**kwargs: object) -> list[float | None]:
            seen.extend(kwargs["id"])  # type: ignore[arg-type]
            return ours(**kwargs)  # type: ignore[no-any-return]

        return reward

    monkeypatch.setattr(trl_grpo, "reward_function", recording)
    out = tmp_path / "trl"
    cell = _cell(lr=0.05, micro_batch_tokens=2 * (16 + trl_grpo.PROMPT_TOKENS))  # 2 rows a micro-batch
    summary = run_trl_grpo(cell, model, small_world / "data/gsm8k", out)
    rows = question_rows(read_records(small_world / "data/gsm8k/train.jsonl"), cell)
    assert seen == [r["id"] for r in rows for _ in range(4)]  # 3 steps x 2 questions x G = 4, in order
    assert summary["micro_batches"] == 4  # 8 rollouts a step, 2 a micro-batch
    stops = stop_tokens(AutoTokenizer.from_pretrained(model))
    saved = json.loads((out / "model/generation_config.json").read_text())["eos_token_id"]
    assert saved == list(stops.ids)  # what trl stopped and masked at
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and summary["steps"] == 3
    assert all(0.0 <= r["reward/mean"] <= 1.0 and r["perf/step_seconds"] > 0 for r in rows)
    assert rows[-1]["perf/wall_seconds"] >= rows[0]["perf/wall_seconds"]
    assert json.loads((out / "DONE").read_text())["generation"] == "transformers generate"
    assert not (out / "work").exists()
    before, after = load_file(str(model / "model.safetensors")), load_file(str(out / "model/model.safetensors"))
    assert before.keys() == after.keys()
    # a random model's 16-token answers are all cut: reward 0, no advantage, no gradient; the weights
    # stay (beta 0, no weight decay), which says the reward reached the loss as ours does
    assert all(torch.equal(before[k], after[k]) for k in before) == all(r["reward/mean"] == 0.0 for r in rows)
    assert run_trl_grpo(cell, model, small_world / "data/gsm8k", out) == summary  # done: not retrained
