"""Shared by the RL tests and the two-process worker: a rollout engine with scripted answers, and
`train`, the tests' shorthand for one RL run."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from meml.core.stops import stop_tokens
from meml.data.experts import DEFAULT_PROMPTS
from meml.training.rollout import Completion, Sampling


class ScriptedEngine:
    """Answers every expert-1 prompt correctly and every other expert wrongly; records the prompts."""

    def __init__(self, tokenizer: Any, answers: dict[str, str], finished: bool = True) -> None:
        self.tokenizer, self.answers, self.calls = tokenizer, answers, []
        self.finished = finished  # False: every reply is cut at the token cap (no stop token)

    def sync_weights(self, model: Any) -> None:
        pass

    def replies(self, text: str, question: str, k: int) -> list[str]:
        """The k answers to one (question, expert) prompt."""
        right = f"#### {self.answers[question]}"
        return [right if DEFAULT_PROMPTS[1] in text else "#### 100000"] * k

    def generate(
        self, prompts: Sequence[Sequence[int]], n: int | Sequence[int], sampling: Sampling
    ) -> list[list[Completion]]:
        counts = [n] * len(prompts) if isinstance(n, int) else list(n)
        eos = [stop_tokens(self.tokenizer).end_of_turn]
        out = []
        for p, k in zip(prompts, counts, strict=True):
            text = self.tokenizer.decode(list(p))
            self.calls.append(text)
            question = next(q for q in self.answers if q in text)
            replies = self.replies(text, question, k)
            stop = eos if self.finished else []
            encoded = [self.tokenizer(r, add_special_tokens=False)["input_ids"] + stop for r in replies]
            out.append([Completion(ids, r, self.finished) for ids, r in zip(encoded, replies, strict=True)])
        return out


def scripted_engine(model_dir: Path, data_dir: Path) -> ScriptedEngine:
    """A ScriptedEngine for the questions of data_dir/train.jsonl, with model_dir's tokenizer."""
    from transformers import AutoTokenizer

    from meml.core.records import read_records

    answers = {r.question: r.answer for r in read_records(data_dir / "train.jsonl")}
    return ScriptedEngine(AutoTokenizer.from_pretrained(model_dir), answers)


def train(
    settings: dict[str, Any],
    method: Any,
    model: Path,
    data: Path,
    experts: Path,
    out: Path,
    *,
    seed: int = 0,
    params: dict[str, Any] | None = None,
    precision: Any = None,
    engine: Any = None,
    stop_after: int | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """run_rl with the `rl` section as a config's dict (read into RLSettings here, as the job does)
    and the four folders in order. `stop_after` k: a Ctrl-C as step k + 1 starts its rollouts
    (`stopped_after`), after step k's metrics and any checkpoint it was due."""
    from meml.training.rl import RLArgs, RLPaths, RLSettings, run_rl

    args = RLArgs(RLSettings.from_config(settings), method, seed, precision=precision, params=params or {})
    with stopped_after(stop_after):
        return run_rl(args, RLPaths(model, data, experts, out), engine=engine, progress=progress)


@contextlib.contextmanager
def stopped_after(steps: int | None) -> Iterator[None]:
    """Within: an RL run raises KeyboardInterrupt when it starts sampling step `steps` + 1 (None: never)."""
    from meml.training import rl

    if steps is None:
        yield
        return
    original, started = rl.sample_groups, [0]

    def sample_or_stop(*args: Any, **kwargs: Any) -> Any:
        started[0] += 1
        if started[0] > steps:
            raise KeyboardInterrupt(f"stopped after step {steps} (simulated kill)")
        return original(*args, **kwargs)

    rl.sample_groups = sample_or_stop
    try:
        yield
    finally:
        rl.sample_groups = original
