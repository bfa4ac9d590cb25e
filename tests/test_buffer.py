from __future__ import annotations

import json

import pytest

from meml.training.buffer import HardExample, HardExampleBuffer


def test_threshold_is_a_strict_failure_rate() -> None:
    buf = HardExampleBuffer(capacity=10, threshold=0.75, insert_prob=1.0)
    assert not buf.offer(HardExample("q", 0), 6, 8)  # exactly K of G: not "more than K"
    assert buf.offer(HardExample("q", 0), 7, 8)
    assert not buf.offer(HardExample("q", 1), 2, 3)  # split spread, 3 rollouts: 2 wrong is not enough
    assert buf.offer(HardExample("q", 1), 3, 3)


def test_insertion_probability_is_seeded() -> None:
    def accepted(seed: int) -> list[bool]:
        buf = HardExampleBuffer(capacity=10_000, insert_prob=0.75, seed=seed)
        return [buf.offer(HardExample(str(i), 0), 1, 1) for i in range(4000)]

    first = accepted(1)
    assert first == accepted(1) and first != accepted(2)
    assert sum(first) / len(first) == pytest.approx(0.75, abs=0.03)


def test_capacity_and_flush() -> None:
    buf = HardExampleBuffer(capacity=3, insert_prob=1.0)
    for i in range(3):
        assert buf.offer(HardExample(f"q{i}", i), 1, 1)
    assert buf.full and not buf.offer(HardExample("late", 0), 1, 1)  # offers while full are dropped
    items = buf.drain()
    assert [i.question_id for i in items] == ["q0", "q1", "q2"]
    assert not buf.full and buf.items == [] and buf.flushes == 1


def test_state_survives_a_checkpoint_round_trip() -> None:
    buf = HardExampleBuffer(capacity=50, insert_prob=0.5, seed=7)
    for i in range(20):
        buf.offer(HardExample(f"q{i}", i % 3), 1, 1)
    state = json.loads(json.dumps(buf.state_dict()))  # as stored on disk
    restored = HardExampleBuffer(capacity=50, insert_prob=0.5, seed=999)
    restored.load_state_dict(state)
    assert restored.items == buf.items and restored.flushes == buf.flushes
    future = [HardExample(f"n{i}", 0) for i in range(30)]
    assert [buf.offer(x, 1, 1) for x in future] == [restored.offer(x, 1, 1) for x in future]


def test_bad_settings() -> None:
    with pytest.raises(ValueError, match="bad buffer settings"):
        HardExampleBuffer(capacity=0)
