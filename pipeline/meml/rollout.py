"""Rollout engines: turn prompts into sampled completions. The RL loop sees only this interface,
so a vLLM engine can plug in later without touching the loop.

    engine.generate(prompt_ids, n, sampling) -> n completions per prompt (token ids, text); n is one
                                                count for all prompts or one count per prompt
    engine.sync_weights(model)               -> make the engine sample from the current policy

The HF engine samples from the policy module itself, so its weights are always current; an
engine that keeps its own copy (vLLM) must implement `sync_weights`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]  # completion tokens, eos included when the model stopped, no padding
    text: str  # decoded without special tokens
    finished: bool  # ended with eos (not cut at max_new_tokens)


class RolloutEngine(Protocol):
    def generate(
        self, prompts: Sequence[Sequence[int]], n: int | Sequence[int], sampling: Sampling
    ) -> list[list[Completion]]: ...

    def sync_weights(self, model: Any) -> None: ...


class HFEngine:
    """Batched `model.generate` with left padding; samples with torch's global RNG (seeded, resumable)."""

    def __init__(self, model: Any, tokenizer: Any, batch_size: int = 64) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.eos = tokenizer.eos_token_id
        self.pad = tokenizer.pad_token_id

    def sync_weights(self, model: Any) -> None:
        self.model = model  # same module object: nothing to copy

    def generate(
        self, prompts: Sequence[Sequence[int]], n: int | Sequence[int], sampling: Sampling
    ) -> list[list[Completion]]:
        import torch

        counts = [n] * len(prompts) if isinstance(n, int) else list(n)
        # one flat batch for all prompts (fewer decoding loops); prompt i's copies are adjacent
        flat = [list(p) for p, k in zip(prompts, counts, strict=True) for _ in range(k)]
        out: list[Completion] = []
        was_training = self.model.training
        self.model.eval()
        device = next(self.model.parameters()).device
        with torch.no_grad():
            for start in range(0, len(flat), self.batch_size):
                chunk = flat[start : start + self.batch_size]
                width = max(len(p) for p in chunk)
                ids = torch.full((len(chunk), width), self.pad, dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for row, p in enumerate(chunk):
                    ids[row, width - len(p) :] = torch.tensor(p)
                    mask[row, width - len(p) :] = 1
                kwargs: dict[str, Any] = {
                    "max_new_tokens": sampling.max_new_tokens,
                    "eos_token_id": self.eos,
                    "pad_token_id": self.pad,
                }
                if sampling.greedy:
                    kwargs.update(do_sample=False)
                else:
                    kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
                generated = self.model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), **kwargs)
                for row in generated[:, width:].tolist():
                    tokens = []
                    for t in row:
                        tokens.append(t)
                        if t == self.eos:
                            break
                    finished = bool(tokens) and tokens[-1] == self.eos
                    if not finished:
                        tokens = [t for t in tokens if t != self.pad]
                    out.append(Completion(tokens, self.tokenizer.decode(tokens, skip_special_tokens=True), finished))
        if was_training:
            self.model.train()
        starts = [sum(counts[:i]) for i in range(len(counts))]
        return [out[start : start + k] for start, k in zip(starts, counts, strict=True)]


def prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of a chat prompt ending with the assistant header."""
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(encoded["input_ids"])
