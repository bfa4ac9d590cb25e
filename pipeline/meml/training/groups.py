"""Steps 1-3 of the RL loop: which questions, the experts' rollouts on them, and their rewards.

A step's rollouts are kept as Groups: prompt [Q][E] and completions [Q][E][n_qe] (token ids), with
rewards, correct and valid as (Q, E, R) tensors, R = the largest n_qe (valid marks the slots that
hold a rollout). `sample_step` samples them, with DAPO-style dynamic sampling when a method asks.

When G does not divide among the experts (8 over 3: 3/3/2), which expert gets the smaller subgroup
turns from question to question (`question_counts`): a fixed 2 for the last expert would make its
subgroup flat (advantage 0) more often, and make it IML's best or worst more often, for no reason
but its place in the list.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from meml.core.answers import RewardConfig, score
from meml.core.records import Record
from meml.data.experts import chat_messages
from meml.training.distributed import Dist
from meml.training.rollout import Completion, RolloutEngine, Sampling, prompt_ids


class QuestionOrder:
    """Questions in a seeded random order, a new permutation each epoch; resumable by its state."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch, self.position = n, seed, 0, 0
        self._perm = self._permutation()

    def _permutation(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def take(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            if self.position == self.n:
                self.epoch, self.position = self.epoch + 1, 0
                self._perm = self._permutation()
            out.append(self._perm[self.position])
            self.position += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self._perm = self._permutation()


@dataclass
class Groups:
    """The rollouts of Q questions by E experts (the module's docstring has the shapes)."""

    records: list[Record]
    prompt: list[list[list[int]]]
    completions: list[list[list[Completion]]]
    rewards: Tensor
    correct: Tensor
    valid: Tensor
    counts: list[list[int]]  # [Q][E]: n_qe, the rollouts of expert e on question q

    def informative(self) -> Tensor:
        """(Q,) True where some (question, expert) subgroup has rewards that differ: a gradient."""
        high = self.rewards.masked_fill(~self.valid, float("-inf")).amax(-1)
        low = self.rewards.masked_fill(~self.valid, float("inf")).amin(-1)
        return ((high > low) & self.valid.any(-1)).any(-1)

    def replace(self, rows: list[int], fresh: Groups) -> None:
        """Put fresh's questions into the given rows (dynamic sampling)."""
        for i, q in enumerate(rows):
            self.records[q], self.prompt[q], self.completions[q], self.counts[q] = (
                fresh.records[i],
                fresh.prompt[i],
                fresh.completions[i],
                fresh.counts[i],
            )
            self.rewards[q], self.correct[q], self.valid[q] = fresh.rewards[i], fresh.correct[i], fresh.valid[i]


def question_counts(counts: list[int], question_id: str) -> list[int]:
    """Each expert's rollouts on one question: `counts` (rollouts_per_expert) turned by a shift that
    the question's id decides (crc32, the same in every process and run), so that over the
    questions each expert gets the smaller subgroup equally often."""
    shift = zlib.crc32(question_id.encode()) % len(counts)
    return counts[len(counts) - shift :] + counts[: len(counts) - shift]


def sample_groups(
    engine: RolloutEngine,
    tokenizer: Any,
    batch: list[Record],
    experts: list[int],
    counts: list[int],
    sampling: Sampling,
    prompts: tuple[str, ...] | list[str],
    reward_config: RewardConfig,
) -> Groups:
    """Steps 2 and 3 of the loop: every expert's rollouts for every question, in one engine call
    (each (question, expert) prompt with its rollout count, question_counts), scored by the checker."""
    Q, E, R = len(batch), len(experts), max(counts)
    prompt = [[prompt_ids(tokenizer, chat_messages(r, k, prompts)) for k in experts] for r in batch]  # [Q][E]
    per_question = [question_counts(counts, r.id) for r in batch]  # [Q][E]
    flat_counts = [n for row in per_question for n in row]
    sampled = engine.generate([prompt[q][e] for q in range(Q) for e in range(E)], flat_counts, sampling)
    completions = [[sampled[q * E + e] for e in range(E)] for q in range(Q)]
    rewards = torch.zeros(Q, E, R)
    correct = torch.zeros(Q, E, R, dtype=torch.bool)
    valid = torch.zeros(Q, E, R, dtype=torch.bool)
    for q, record in enumerate(batch):
        for e in range(E):
            for r, c in enumerate(completions[q][e]):
                ok, value = score(c.text, record.dataset, record.answer, record.options, reward_config, c.finished)
                correct[q, e, r], valid[q, e, r], rewards[q, e, r] = ok, True, value
    return Groups(list(batch), prompt, completions, rewards, correct, valid, per_question)


@dataclass(frozen=True)
class Sampled:
    groups: Groups
    rollouts: int  # sampled in this step by every process, dynamic sampling's rounds included
    replaced: int  # questions dynamic sampling replaced
    rounds: int


def sample_step(
    dist: Dist,
    records: list[Record],
    order: QuestionOrder,
    Q: int,
    per_question: int,
    rounds_allowed: int,
    sample: Any,
) -> Sampled:
    """Steps 1-3: this process's block of Q questions from the shared order, sampled and scored by
    `sample(batch) -> Groups` (per_question rollouts each); then up to `rounds_allowed` rounds of
    dynamic sampling, each replacing the questions whose rollouts all got the same reward with
    fresh ones from the order."""
    batch: list[Record] = dist.block([records[i] for i in order.take(Q)])
    groups = sample(batch)
    rollouts, replaced, rounds = Q * per_question, 0, 0
    while rounds < rounds_allowed:
        informative = groups.informative()  # (Qp,) some subgroup with a reward spread
        dead = [q for q in range(len(batch)) if not informative[q]]
        dead_counts = dist.gather(len(dead))  # fresh questions come from the shared order
        if sum(dead_counts) == 0:
            break
        rounds += 1
        fresh_all = [records[i] for i in order.take(sum(dead_counts))]
        mine = sum(dead_counts[: dist.rank])
        if dead:
            groups.replace(dead, sample(fresh_all[mine : mine + len(dead)]))
        rollouts += sum(dead_counts) * per_question
        replaced += sum(dead_counts)
    return Sampled(groups, rollouts, replaced, rounds)
