"""Rollout engines: turn prompts into sampled completions. The RL loop sees only this interface:

    engine.generate(prompt_ids, n, sampling) -> n completions per prompt (token ids, text); n is one
                                                count for all prompts or one count per prompt
    engine.sync_weights(model)               -> make the engine sample from the current policy
    engine.fingerprint()                     -> a checksum of the weights it samples from, or None
                                                when it samples from the policy module itself
    engine.verify(policy)                    -> (instead of fingerprint) raise StaleWeightsError
                                                unless it holds the policy's weights (vLLM)

`HFEngine` samples from the policy module, so its weights are always current. An engine with its
own copy of the weights (`HFCopyEngine` here, `VLLMEngine` in rollout_vllm.py) must copy them in
`sync_weights` after every optimiser step; the loop then calls `check_synced`, which compares the
engine's fingerprint with the policy's and stops the run if they differ. A stale copy would
otherwise go unnoticed: training goes on, on rollouts of an older policy.

Both engines take the same `Sampling`, translated by `hf_generation_kwargs` and
`vllm_sampling_kwargs`, and sample in the run's compute precision (precision.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from meml.core.precision import Precision, resolve
from meml.core.stops import stop_tokens


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]  # completion tokens, the stop token included when the model stopped, no padding
    text: str  # decoded without special tokens
    finished: bool  # ended with a stop token (stops.py), not cut at max_new_tokens
    # log p of each token where the engine drew it (softmax(logits / T), after top-p); None when the
    # engine does not report them. The RL loop logs its gap to the learner's own log-probs.
    logprobs: tuple[float, ...] | None = None


class RolloutEngine(Protocol):
    def generate(
        self, prompts: Sequence[Sequence[int]], n: int | Sequence[int], sampling: Sampling
    ) -> list[list[Completion]]: ...

    def sync_weights(self, model: Any) -> None: ...


class StaleWeightsError(RuntimeError):
    """The engine would sample from weights other than the policy's."""


def weights_fingerprint(named_parameters: Any, dtype: str) -> tuple[float, float]:
    """(sum, sum of squares) of every parameter, cast to `dtype` first: the engine holds the
    weights in its compute dtype, so the policy's fp32 master weights are compared as the engine
    would hold them. Every tensor counts: a sync that skipped any one of them changes the sums."""
    import torch

    total, squares = 0.0, 0.0
    for _, p in named_parameters:
        x = p.detach().to(getattr(torch, dtype)).double()
        total, squares = total + float(x.sum()), squares + float((x * x).sum())
    return total, squares


def check_synced(engine: Any, model: Any) -> dict[str, float]:
    """Raise StaleWeightsError when an engine with its own weights does not hold the policy's;
    return what the check measured, as the step's sync/* metrics. An engine may check itself
    (`verify`: the vLLM engine, whose tensors are fused and repacked: the probe's largest log-prob
    gap, and how many tensors were compared exactly); otherwise its `fingerprint` is compared with
    the policy's. An engine that samples from the policy module itself has nothing to check."""
    verify = getattr(engine, "verify", None)
    if verify is not None:
        measured = verify(model)
        return {
            "sync/logprob_gap": float(measured["logprob_gap"]),
            "sync/tensors_exact": float(measured["exact"]),
            "sync/tensors_by_logprobs": float(measured["by_logprobs"]),
        }
    fingerprint = getattr(engine, "fingerprint", None)
    got = fingerprint() if fingerprint is not None else None
    if got is None:
        return {}
    want = weights_fingerprint(model.named_parameters(), engine.dtype)
    if got != want:
        raise StaleWeightsError(
            f"{type(engine).__name__} holds other weights than the policy after sync_weights "
            f"(fingerprint {got} != {want}): its rollouts would come from a stale policy"
        )
    return {"sync/fingerprint_equal": 1.0}


def hf_generation_kwargs(sampling: Sampling) -> dict[str, Any]:
    """`Sampling` for transformers' generate: top_k off, so only temperature and top_p shape it."""
    if sampling.greedy:
        return {"max_new_tokens": sampling.max_new_tokens, "do_sample": False}
    return {
        "max_new_tokens": sampling.max_new_tokens,
        "do_sample": True,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": 0,
    }


def vllm_sampling_kwargs(sampling: Sampling, n: int, stop_ids: Sequence[int] = ()) -> dict[str, Any]:
    """The same `Sampling` for vLLM's SamplingParams (greedy is temperature 0 there; top_k is off
    by default, as in hf_generation_kwargs); `stop_ids`: the turn's stop tokens (stops.py)."""
    return {
        "stop_token_ids": list(stop_ids),
        "n": n,
        "max_tokens": sampling.max_new_tokens,
        "temperature": 0.0 if sampling.greedy else sampling.temperature,
        "top_p": 1.0 if sampling.greedy else sampling.top_p,
        "skip_special_tokens": True,
    }


class DrawnLogprobs:
    """A logits processor placed after temperature and top-p: each step it keeps the log-softmax of
    the final scores (the distribution the token is drawn from) and, on the next call, takes the
    log-prob of the token that was drawn from it. One (B, V) step is held at a time, where
    generate's output_scores would hold every step's."""

    def __init__(self) -> None:
        self.last: Any = None
        self.drawn: list[Any] = []  # (B,) per generated token

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if self.last is not None:
            self.drawn.append(self.last.gather(1, input_ids[:, -1:]).squeeze(1))
        self.last = scores.float().log_softmax(dim=-1)
        return scores

    def per_token(self, generated: Any) -> Any:
        """(B, n) log-probs of the n generated tokens (generate may have run and undone a step);
        None when generate called no processor (a stand-in model's own generate)."""
        import torch

        if self.last is None:
            return None
        n = generated.shape[1]
        drawn = self.drawn[:n]
        if len(drawn) < n:
            drawn.append(self.last.gather(1, generated[:, -1:]).squeeze(1))
        return torch.stack(drawn, dim=1) if drawn else generated.new_zeros((generated.shape[0], 0)).float()


def hf_logits_processors(sampling: Sampling) -> tuple[dict[str, Any], list[Any]]:
    """generate's arguments with temperature and top-p given as explicit processors, followed by a
    DrawnLogprobs (transformers puts a caller's processors before its own temperature and top-p,
    so those are switched off in the generation config and applied here, in the same order)."""
    from transformers import TemperatureLogitsWarper, TopPLogitsWarper

    kwargs = hf_generation_kwargs(sampling)
    processors: list[Any] = []
    if not sampling.greedy:
        if sampling.temperature != 1.0:
            processors.append(TemperatureLogitsWarper(sampling.temperature))
        if sampling.top_p < 1.0:
            processors.append(TopPLogitsWarper(sampling.top_p))
        kwargs.update(temperature=1.0, top_p=1.0)
    return kwargs, processors


class HFEngine:
    """Batched `model.generate` with left padding; samples with torch's global RNG (seeded, resumable)."""

    def __init__(self, model: Any, tokenizer: Any, batch_size: int = 64, precision: Precision | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.precision = precision or resolve("cpu")
        self.dtype = self.precision.dtype
        self.stops = stop_tokens(tokenizer)  # end of turn and eos: they differ in real tokenizers
        self.pad = tokenizer.pad_token_id

    def sync_weights(self, model: Any) -> None:
        self.model = model  # same module object: nothing to copy

    def fingerprint(self) -> tuple[float, float] | None:
        return None  # samples from the policy module itself

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
                settings, processors = hf_logits_processors(sampling)
                recorder = DrawnLogprobs()
                kwargs = {
                    **settings,
                    "logits_processor": [*processors, recorder],
                    "eos_token_id": list(self.stops.ids),
                    "pad_token_id": self.pad,
                }
                with self.precision.autocast():
                    generated = self.model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), **kwargs)
                per_token = recorder.per_token(generated[:, width:])
                rows = generated[:, width:].tolist()
                drawn = per_token.tolist() if per_token is not None else [None] * len(rows)
                for row, row_logp in zip(rows, drawn, strict=True):
                    tokens = []
                    for t in row:
                        tokens.append(t)
                        if t in self.stops.ids:
                            break
                    finished = bool(tokens) and tokens[-1] in self.stops.ids
                    kept = range(len(tokens)) if finished else [i for i, t in enumerate(tokens) if t != self.pad]
                    logprobs = None if row_logp is None else tuple(row_logp[i] for i in kept)
                    tokens = [tokens[i] for i in kept]
                    text = self.tokenizer.decode(tokens, skip_special_tokens=True)
                    out.append(Completion(tokens, text, finished, logprobs))
        if was_training:
            self.model.train()
        starts = [sum(counts[:i]) for i in range(len(counts))]
        return [out[start : start + k] for start, k in zip(starts, counts, strict=True)]


class HFCopyEngine(HFEngine):
    """An HF engine with its own copy of the weights, in the compute dtype, refreshed by
    `sync_weights`: the CPU stand-in for vLLM's weight sync (engine: hf-copy), which lets the
    tests catch a stale copy without a GPU."""

    def __init__(self, model: Any, tokenizer: Any, batch_size: int = 64, precision: Precision | None = None) -> None:
        import copy

        super().__init__(model, tokenizer, batch_size, precision)
        self.model = copy.deepcopy(model).to(self.precision.torch_dtype()).eval().requires_grad_(False)

    def sync_weights(self, model: Any) -> None:
        self.model.load_state_dict(model.state_dict())  # copies, casting to the copy's dtype

    def fingerprint(self) -> tuple[float, float] | None:
        return weights_fingerprint(self.model.named_parameters(), self.dtype)


def prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of a chat prompt ending with the assistant header."""
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(encoded["input_ids"])
