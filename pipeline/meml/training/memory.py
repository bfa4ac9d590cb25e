"""What one RL or SFT job holds on its GPU at a config's shapes, measured on a CPU: the job's own
code runs on the meta device (the RL update's scoring, scoring.completion_logprobs; SFT's decoder)
on a model built from the paper model's architecture as probe.PAPER_ARCHITECTURES writes it out
(nothing is downloaded, no weight exists), and autograd's saved tensors are counted. To that come
the parts whose size is their shape:

    weights, gradients, AdamW   fp32 master weights, their gradients, two moments: 16 bytes a weight
    reference                   RL: a second fp32 copy when rl.beta > 0
    saved for backward          measured: the worst micro-batch's scoring passes under gradient
                                checkpointing (layer inputs and the fp32 log-softmax of its
                                completion tokens), each storage once, parameters aside
    recompute                   measured: one decoder layer's saved tensors on that micro-batch,
                                rebuilt while the backward pass goes through it (on the meta device
                                attention keeps its (rows, heads, T, T) probabilities, which a GPU's
                                fused kernels do not: an overcount, on the safe side)
    head transients             RL: 3 x one pass's fp32 (rows, tokens, V) log-softmax beside the
                                saved one: the logits upcast before it, and the two products of the
                                entropy (exp, and exp x log p) that the first update computes; the
                                backward's two (the gradient flowing in, the one flowing out) are fewer.
                                SFT: trl's fused head's tiles and its fp32 gradients of the output
                                layer and the hidden states
    vLLM                        RL: rl.vllm.gpu_memory_utilization x the GPU's memory
                                (launch.gpu_memory_gib), with rl.engine: vllm (colocated)

The worst RL micro-batch: scoring.micro_batches counts padded tokens (scoring.padded_tokens) against
rl.micro_batch_tokens, rows scored whole under checkpointing, so a micro-batch holds at most the budget
in padded positions (a single row over it goes alone). Its memory grows with its positions and, through
the output layer, with its completion tokens; the worst is the budget filled with rows whose
completions are as long as the cap allows: budget // (cap + 1) rows at the cap, or one row more just
below it (a one-token prompt), whichever holds more; and a lone row of an assumed prompt
(PROMPT_TOKENS) plus the cap when that is over the budget. The worst SFT batch is sft.batch_size rows
of sft.max_length tokens. On the meta device no value can be read, so transformers' check whether the
attention mask is all ones is answered "no" (it then builds the mask: a slight overcount).

    estimate = update_memory(architecture, rl, gpu_memory_gib)   # an UpdateMemory, in bytes
    sft = sft_memory(architecture, sft, gpu_memory_gib)            # an SFTMemory
    lines, refusals = config_lines(cfg)                            # per model, for the dry run
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

GIB = 2**30
PROMPT_TOKENS = 512  # assumed: a lone row's prompt (a system prompt and a question; the paper's fit in ~300)
CUDA_CONTEXT = 1 * GIB  # the CUDA context and allocator's slack, beside what tensors hold
HEAD_COPIES = 3  # fp32 (rows, tokens, V) copies of a pass beside its saved log-softmax (the module's docstring)
# trl's fused LM head (trl.kernels.chunked_logprob, the SFT loss on a GPU): tokens x vocabulary ids a tile
FUSED_HEAD_TILE = (4096, 32768)


@dataclass(frozen=True)
class Shape:
    """A micro-batch of `rows` rows, each `row_tokens` padded positions (prompt + completion) of
    which `completion` are completion tokens."""

    rows: int
    row_tokens: int
    completion: int


def worst_micro_batches(budget: int, cap: int, prompt: int = PROMPT_TOKENS) -> list[Shape]:
    """The micro-batches scoring.micro_batches can make under `budget` padded tokens that hold the
    most (the module's docstring): the largest is the worst, and update_memory measures each.
    `prompt`: the longest prompt, for a row over the budget (which goes alone)."""
    out = []
    at_cap = budget // (cap + 1)
    if at_cap >= 1:  # completions at the cap, each row's prompt the rest of its share
        out.append(Shape(at_cap, budget // at_cap, cap))
    below = budget // (at_cap + 1)  # one row more, each completion just below the cap
    if below >= 2:
        out.append(Shape(at_cap + 1, below, below - 1))
    if prompt + cap > budget:  # a row over the budget goes alone
        out.append(Shape(1, prompt + cap, cap))
    return out


@dataclass(frozen=True)
class UpdateMemory:
    parameters: int  # weights in the model
    weights_and_optimizer: int
    reference: int
    saved_for_backward: int
    recompute: int
    head_transients: int
    vllm: int
    rows: int  # rows in the worst micro-batch
    row_tokens: int  # padded prompt + completion tokens a row
    gpu: int  # the GPU's memory
    completion: int = 0  # completion tokens a row (the output layer's positions)

    @property
    def training(self) -> int:
        parts = (self.weights_and_optimizer, self.reference, self.saved_for_backward, self.recompute)
        return sum(parts) + self.head_transients + CUDA_CONTEXT

    @property
    def total(self) -> int:
        return self.training + self.vllm

    @property
    def fits(self) -> bool:
        return self.total <= self.gpu

    def line(self, name: str) -> str:
        """One line for the dry run and gpu_check: the total beside the GPU, and its parts."""
        verdict = "fits" if self.fits else "DOES NOT FIT"
        return (
            f"{name}: RL update {self.total / GIB:.1f} GiB of {self.gpu / GIB:.0f} GiB ({verdict}), worst micro-batch "
            f"{self.rows} x {self.row_tokens} padded tokens ({self.completion} of them completion): "
            f"weights+grads+AdamW {self.weights_and_optimizer / GIB:.1f}, reference {self.reference / GIB:.1f}, "
            f"saved for backward {self.saved_for_backward / GIB:.1f}, recompute {self.recompute / GIB:.1f}, "
            f"head transients {self.head_transients / GIB:.1f} (with the entropy's), CUDA {CUDA_CONTEXT / GIB:.0f}, "
            f"vLLM {self.vllm / GIB:.1f}"
        )

    def record(self) -> dict[str, Any]:
        return {**asdict(self), "training": self.training, "total": self.total, "fits": self.fits}


@dataclass(frozen=True)
class SFTMemory:
    parameters: int
    weights_and_optimizer: int
    saved_for_backward: int
    recompute: int
    head_transients: int
    rows: int  # sft.batch_size: sequences a process takes a micro-step
    row_tokens: int  # sft.max_length
    gpu: int

    @property
    def total(self) -> int:
        parts = (self.weights_and_optimizer, self.saved_for_backward, self.recompute, self.head_transients)
        return sum(parts) + CUDA_CONTEXT

    @property
    def fits(self) -> bool:
        return self.total <= self.gpu

    def line(self, name: str) -> str:
        verdict = "fits" if self.fits else "DOES NOT FIT"
        return (
            f"{name}: SFT {self.total / GIB:.1f} GiB of {self.gpu / GIB:.0f} GiB ({verdict}), a batch of "
            f"{self.rows} x {self.row_tokens} tokens: weights+grads+AdamW {self.weights_and_optimizer / GIB:.1f}, "
            f"saved for backward {self.saved_for_backward / GIB:.1f}, recompute {self.recompute / GIB:.1f}, "
            f"head transients {self.head_transients / GIB:.1f}, CUDA {CUDA_CONTEXT / GIB:.0f}"
        )

    def record(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total, "fits": self.fits}


@contextlib.contextmanager
def _mask_checks_answered_no() -> Iterator[None]:
    """transformers skips building a causal mask when it reads an all-ones padding mask; a meta
    tensor has no values to read, so the check is answered "not all ones" while this is open."""
    import transformers.masking_utils as masking

    original = masking._ignore_causal_mask_sdpa
    masking._ignore_causal_mask_sdpa = lambda *args, **kwargs: False
    try:
        yield
    finally:
        masking._ignore_causal_mask_sdpa = original


def meta_model(architecture: dict[str, Any], layers: int | None = None, checkpointing: bool = True) -> Any:
    """The architecture as a model on the meta device (shapes, no weights), in training mode."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    arch = dict(architecture)
    model_type = arch.pop("model_type")
    if layers is not None:
        arch["num_hidden_layers"] = layers
    config = AutoConfig.for_model(model_type, **arch)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if checkpointing:
        model.gradient_checkpointing_enable()
    return model.train()


@contextlib.contextmanager
def _counting_saved(model: Any) -> Iterator[dict[int, int]]:
    """While open, every tensor autograd saves for backward, by storage (each once), the model's
    parameters aside: {storage: bytes}."""
    import torch

    params = {p.untyped_storage()._cdata for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage._cdata not in params:
            seen.setdefault(storage._cdata, storage.nbytes())
        return t

    with _mask_checks_answered_no(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield seen


def saved_bytes(model: Any, rows: int, prompt: int, completion: int) -> int:
    """The bytes autograd keeps for backward when the update scores `rows` rows of `prompt` +
    `completion` tokens, with the entropy (as the first update does): each storage once, the
    model's parameters aside."""
    from meml.training.scoring import completion_logprobs

    with _counting_saved(model) as seen:
        completion_logprobs(model, [[1] * prompt] * rows, [[2] * completion] * rows, 0, with_entropy=True)
    return sum(seen.values())


def _measured(architecture: dict[str, Any], measure: Any, *shape: int) -> tuple[int, int]:
    """(saved for backward by the whole model, one layer's recompute) of `measure(model, *shape)`."""
    saved = measure(meta_model(architecture), *shape)
    # one layer's activations, rebuilt during backward: a one-layer model without checkpointing
    # keeps them all; with checkpointing, only the layer's input (the difference is the layer)
    one = measure(meta_model(architecture, layers=1, checkpointing=False), *shape)
    one_checkpointed = measure(meta_model(architecture, layers=1), *shape)
    return saved, max(0, one - one_checkpointed)


def update_memory(
    architecture: dict[str, Any], rl: dict[str, Any], gpu_memory_gib: float, prompt: int = PROMPT_TOKENS
) -> UpdateMemory:
    """The RL update's memory on one GPU at its worst micro-batch (the module's docstring lists the
    parts). `rl`: the rl section with the data set's entry laid over it (its max_new_tokens,
    micro_batch_tokens, beta and vllm.gpu_memory_utilization are read); `prompt`: the longest prompt."""
    from meml.training.scoring import ROWS_PER_PASS

    parameters = _parameters(architecture)
    gpu = int(gpu_memory_gib * GIB)
    vocab = int(architecture["vocab_size"])
    estimates = []
    for shape in worst_micro_batches(int(rl["micro_batch_tokens"]), int(rl["max_new_tokens"]), prompt):
        prompt = shape.row_tokens - shape.completion
        saved, recompute = _measured(architecture, saved_bytes, shape.rows, prompt, shape.completion)
        # the transients are one pass's: at most ROWS_PER_PASS rows
        one_pass = min(shape.rows, ROWS_PER_PASS) * shape.completion * vocab * 4
        estimates.append(
            UpdateMemory(
                parameters=parameters,
                weights_and_optimizer=16 * parameters,
                reference=4 * parameters if float(rl.get("beta") or 0) > 0 else 0,
                saved_for_backward=saved,
                recompute=recompute,
                head_transients=HEAD_COPIES * one_pass,
                vllm=int(float(rl["vllm"]["gpu_memory_utilization"]) * gpu) if rl["engine"] == "vllm" else 0,
                rows=shape.rows,
                row_tokens=shape.row_tokens,
                gpu=gpu,
                completion=shape.completion,
            )
        )
    return max(estimates, key=lambda e: e.total)


def _parameters(architecture: dict[str, Any]) -> int:
    return sum(p.numel() for p in meta_model(architecture, checkpointing=False).parameters())


def sft_saved_bytes(model: Any, rows: int, tokens: int) -> int:
    """The bytes autograd keeps for backward on an SFT batch of `rows` x `tokens` under trl's fused
    LM head (what SFTTrainer computes the loss with on a GPU, trl 1.16): the decoder's, measured, and
    the head's, by its shape: it saves the hidden states of the positions it scores (fp32), their
    target ids, log Z and entropies, two masks of them and the loss's count, never the (positions, V)
    logits."""
    import torch

    ids = torch.ones((rows, tokens), dtype=torch.long, device="meta")
    with _counting_saved(model) as seen:
        model.get_decoder()(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    positions = rows * (tokens - 1)  # each position but the last predicts the next token
    return sum(seen.values()) + positions * (int(model.config.hidden_size) * 4 + 8 + 4 + 4 + 2) + 8


def sft_memory(architecture: dict[str, Any], sft: dict[str, Any], gpu_memory_gib: float) -> SFTMemory:
    """One SFT process's memory on one GPU at a batch of sft.batch_size x sft.max_length tokens (the
    module's docstring lists the parts)."""
    rows, tokens = int(sft["batch_size"]), int(sft["max_length"])
    parameters = _parameters(architecture)
    saved, recompute = _measured(architecture, sft_saved_bytes, rows, tokens)
    hidden, vocab = int(architecture["hidden_size"]), int(architecture["vocab_size"])
    tile_tokens, tile_ids = FUSED_HEAD_TILE
    # a tile of logits, computed again in backward; fp32 gradients of the output layer and of the hidden states
    head = 2 * min(rows * tokens, tile_tokens) * tile_ids * 4 + vocab * hidden * 4 + rows * tokens * hidden * 4
    return SFTMemory(
        parameters=parameters,
        weights_and_optimizer=16 * parameters,
        saved_for_backward=saved,
        recompute=recompute,
        head_transients=head,
        rows=rows,
        row_tokens=tokens,
        gpu=int(gpu_memory_gib * GIB),
    )


def largest_cap_rl(cfg: dict[str, Any]) -> dict[str, Any]:
    """The rl settings (with its data set's entry) of the grid's data set with the largest answer cap."""
    from meml.core.config import dataset_rl

    return max((dataset_rl(cfg, ds) for ds in cfg["grid"]["datasets"]), key=lambda r: int(r["max_new_tokens"]))


def _grid_models(cfg: dict[str, Any]) -> list[str]:
    return list(cfg["grid"].get("models") or list(cfg["models"]))


def config_estimates(cfg: dict[str, Any]) -> dict[str, UpdateMemory]:
    """Per grid model, its RL update at the largest answer cap among the grid's data sets."""
    from meml.training.probe import architecture

    rl, gpu = largest_cap_rl(cfg), float(cfg["launch"]["gpu_memory_gib"])
    return {m: update_memory(architecture(cfg, m), rl, gpu) for m in _grid_models(cfg)}


def config_sft_estimates(cfg: dict[str, Any]) -> dict[str, SFTMemory]:
    """Per grid model, one SFT process at sft.batch_size x sft.max_length."""
    from meml.training.probe import architecture

    gpu = float(cfg["launch"]["gpu_memory_gib"])
    return {m: sft_memory(architecture(cfg, m), cfg["sft"], gpu) for m in _grid_models(cfg)}


def config_lines(cfg: dict[str, Any]) -> tuple[list[str], list[str]]:
    """config_estimates and config_sft_estimates as (the lines the dry run prints, the refusals). A
    refusal names the keys that shrink the job."""
    from meml.core.precision import of_config

    lines = ["The RL update and SFT on one GPU, measured on the meta device (training/memory.py):"]
    refusals = []
    if not of_config(cfg).gradient_checkpointing:
        lines.append(
            "  note: gradient_checkpointing is off: these figures assume it on (every layer's activations kept instead)"
        )
    budget = largest_cap_rl(cfg)["micro_batch_tokens"]
    sft = config_sft_estimates(cfg)
    for model, memory in config_estimates(cfg).items():
        lines += ["  " + memory.line(model), "  " + sft[model].line(model)]
        if not memory.fits:
            refusals.append(
                f"models.{model}: the RL update needs {memory.total / GIB:.1f} GiB of launch.gpu_memory_gib "
                f"{memory.gpu / GIB:.0f}: lower rl.micro_batch_tokens (now {budget}) or "
                "rl.vllm.gpu_memory_utilization, or name a larger GPU"
            )
        if not sft[model].fits:
            refusals.append(
                f"models.{model}: SFT needs {sft[model].total / GIB:.1f} GiB of launch.gpu_memory_gib "
                f"{sft[model].gpu / GIB:.0f}: lower sft.batch_size (now {cfg['sft']['batch_size']}, raising "
                f"sft.grad_accum to keep the effective batch) or sft.max_length (now {cfg['sft']['max_length']})"
            )
    return lines, refusals
