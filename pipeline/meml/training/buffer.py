"""HSFT's hard-example buffer.

An expert that fails a question in more than K of its G rollouts (a failure rate above K/G, decided
exactly on counts;
paper: K = 6, G = 8) offers (question, expert) to the buffer, which keeps it with probability
`insert_prob` (paper: K/G = 0.75). At `capacity` (paper: B = 64) the RL loop takes one SFT update
on the buffer's contents and empties it. Offers made while it is full are dropped. The buffer has
its own seeded RNG, saved with it, so a resumed run makes the same choices.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any


@dataclass(frozen=True)
class HardExample:
    question_id: str
    expert: int


@dataclass
class HardExampleBuffer:
    capacity: int = 64
    threshold: float = 0.75
    insert_prob: float = 0.75
    seed: int = 0
    items: list[HardExample] = field(default_factory=list)
    flushes: int = 0

    def __post_init__(self) -> None:
        if self.capacity < 1 or not 0 <= self.threshold <= 1 or not 0 <= self.insert_prob <= 1:
            raise ValueError(
                f"bad buffer settings: capacity {self.capacity}, threshold {self.threshold}, "
                f"insert_prob {self.insert_prob}"
            )
        self._rng = random.Random(f"hsft-{self.seed}")

    @property
    def full(self) -> bool:
        return len(self.items) >= self.capacity

    def above_threshold(self, failures: int, rollouts: int) -> bool:
        """failures / rollouts > threshold, decided on exact fractions: the threshold K/G is read as
        the nearest fraction with a small denominator (0.8333... as 5/6), so a rate exactly equal to
        K/G never counts as above it, whatever G is."""
        return Fraction(failures, rollouts) > Fraction(self.threshold).limit_denominator(1000)

    def offer(self, item: HardExample, failures: int, rollouts: int) -> bool:
        """Insert `item` if it failed in more than threshold x rollouts and the coin says so."""
        if not self.above_threshold(failures, rollouts) or self.full:
            return False
        if self._rng.random() >= self.insert_prob:
            return False
        self.items.append(item)
        return True

    def drain(self) -> list[HardExample]:
        items, self.items = self.items, []
        self.flushes += 1
        return items

    def state_dict(self) -> dict[str, Any]:
        return {
            "items": [[i.question_id, i.expert] for i in self.items],
            "flushes": self.flushes,
            "rng": self._rng.getstate(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.items = [HardExample(q, int(e)) for q, e in state["items"]]
        self.flushes = int(state["flushes"])
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))
