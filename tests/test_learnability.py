"""Does the RL loop learn? A test that could fail.

A tiny model is fine-tuned to answer "#### d" with a digit d from 1 to 4 that it cannot know (each
SFT question has its own random digit), so on a new question it guesses: about a quarter of its
rollouts are right. RL then trains on a small repeated set of four new questions whose answer is
3: the reward is there to be learned, by raising one answer the model already gives sometimes.
The loop learns if the training reward rises beyond its noise within a fixed number of steps: the
mean of the last steps above the mean of the first, by Welch's interval and by a margin. The
shuffled-advantage control (the same update sizes, the rewards' information removed) must not
rise so, and neither must three broken loops: the advantage's sign flipped, a loss mask that
misses the completion's tokens, and a rollout engine whose weights are never synced. Every run
samples through the `hf-copy` engine, which holds its own weights, so a stale sync shows.
"""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path
from typing import Any

import pytest
from scipy import stats
from scripted import train

from meml.core.io import atomic_write_jsonl, read_jsonl
from meml.data.experts import DEFAULT_PROMPTS
from meml.data.tiny_models import build_tiny_models
from meml.training.rl import Method
from tests.test_rl import CONFIG, tiny_settings

ANSWERS = "1234"
RL_ANSWER = "3"  # every question of the repeated set: the guesser says it about a quarter of the time
STEPS, EDGE = 36, 8  # the reward's change: the mean of the last EDGE steps minus the first EDGE


def _records(prefix: str, n: int, rng: random.Random, fixed: str | None = None) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        answer = fixed or rng.choice(ANSWERS)
        out.append({
            "id": f"{prefix}-{i:04d}", "dataset": "gsm8k", "split": "train",
            "question": f"Box {prefix} {i} holds a code. What is the code?",
            "answer": answer, "rationale": f"#### {answer}", "options": None, "source": "test",
        })  # fmt: skip
    return out


def _data(root: Path, records: list[dict[str, Any]]) -> tuple[Path, Path]:
    data, experts = root / "data", root / "experts"
    atomic_write_jsonl(data / "train.jsonl", records)
    atomic_write_jsonl(data / "test.jsonl", records[:2])
    atomic_write_jsonl(
        experts / "e1.jsonl", [{"id": r["id"], "expert": 1, "completion": r["rationale"]} for r in records]
    )
    return data, experts


@pytest.fixture(scope="module")
def guesser(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The guessing SFT model, and the repeated question set RL trains on."""
    from meml.training.sft import run_sft

    root = tmp_path_factory.mktemp("learnability")
    rng = random.Random(0)
    sft_records = _records("sft", 300, rng)
    sft_data, sft_experts = _data(root / "sft", sft_records)
    corpus = [f"{p}\n{r['question']}\n{r['rationale']}" for r in sft_records for p in DEFAULT_PROMPTS[:2]]
    base = build_tiny_models(corpus, root / "models", seed=0, vocab_size=400, kinds=("qwen2",))["qwen2"]
    settings = dict(CONFIG["sft"], epochs=3, lr=3e-3, max_length=256, batch_size=16)
    run_sft(base, sft_data, sft_experts, root / "sft-run", [1], settings, seed=0)
    rl_data, rl_experts = _data(root / "rl", _records("rl", 4, random.Random(1), fixed=RL_ANSWER))
    return {"model": root / "sft-run" / "model", "data": rl_data, "experts": rl_experts}


def _learn(guesser: dict[str, Path], out: Path, shuffle: bool = False) -> tuple[list[float], float, float]:
    """The reward of every step, and the Welch interval of last-minus-first."""
    settings = tiny_settings(
        steps=STEPS, questions_per_step=4, group_size=8, max_new_tokens=8, lr=3e-4, temperature=1.0,
        checkpoint_every=STEPS, engine="hf-copy", rollout_batch_size=32,
    )  # fmt: skip
    switches = {**CONFIG["methods"]["Expert1-SFT-GRPO"], "shuffle_advantages": shuffle}
    train(settings, Method.from_config("m", switches), guesser["model"], guesser["data"], guesser["experts"], out)
    rewards = [row["reward/mean"] for _, row in read_jsonl(out / "metrics.jsonl")]
    first, last = rewards[:EDGE], rewards[-EDGE:]
    test = stats.ttest_ind(last, first, equal_var=False)
    low, high = test.confidence_interval(0.95)
    print(f"reward {statistics.fmean(first):.3f} -> {statistics.fmean(last):.3f}: [{low:+.3f}, {high:+.3f}]")
    return rewards, float(low), float(high)


def _learns(low: float, rewards: list[float]) -> bool:
    """Risen beyond its noise: the interval's lower end above 0, and by more than a quarter of the
    reward's range. Welch's interval alone is not enough here: the stale engine's draws from the
    unchanged guesser put its lower end above 0 by chance (+0.02, with a rise of 0.08)."""
    return low > 0 and statistics.fmean(rewards[-EDGE:]) - statistics.fmean(rewards[:EDGE]) > 0.25


def test_grpo_learns_a_repeated_question_set_and_the_shuffled_control_does_not(
    guesser: dict[str, Path], tmp_path: Path
) -> None:
    rewards, low, _ = _learn(guesser, tmp_path / "grpo")
    assert statistics.fmean(rewards[:EDGE]) < 0.5  # it starts by guessing
    assert _learns(low, rewards), rewards
    control, low, _ = _learn(guesser, tmp_path / "shuffled", shuffle=True)
    assert not _learns(low, control), control
    # the control's update is as large as the real one's: the same advantages, permuted
    moved = [json.loads(line)["update/relative_change"] for line in (tmp_path / "grpo/metrics.jsonl").open()]
    moved_control = [
        json.loads(line)["update/relative_change"] for line in (tmp_path / "shuffled/metrics.jsonl").open()
    ]
    assert statistics.fmean(moved_control) > 0.3 * statistics.fmean(moved)


def _flip_sign(monkeypatch: pytest.MonkeyPatch) -> None:
    from meml.training import rl

    real = rl.policy_loss

    def flipped(batch: Any, *args: Any, **kwargs: Any) -> Any:
        import dataclasses

        return real(dataclasses.replace(batch, advantages=-batch.advantages), *args, **kwargs)

    monkeypatch.setattr(rl, "policy_loss", flipped)


def _mask_misses_the_completion(monkeypatch: pytest.MonkeyPatch) -> None:
    from meml.training import rl

    real = rl.completion_logprobs

    def shifted(*args: Any, **kwargs: Any) -> Any:
        logp, mask, entropy = real(*args, **kwargs)
        return logp, ~mask, entropy  # the padding counted, the completion's own tokens not

    monkeypatch.setattr(rl, "completion_logprobs", shifted)


def _stale_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    from meml.training import rl, rollout

    monkeypatch.setattr(rollout.HFCopyEngine, "sync_weights", lambda self, model: None, raising=True)
    monkeypatch.setattr(rl, "check_synced", lambda engine, model: {})


@pytest.mark.parametrize("breakage", [_flip_sign, _mask_misses_the_completion, _stale_engine])
def test_a_broken_loop_fails_the_learnability_check(
    guesser: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, breakage: Any
) -> None:
    breakage(monkeypatch)
    rewards, low, _ = _learn(guesser, tmp_path / "broken")
    assert not _learns(low, rewards), rewards
