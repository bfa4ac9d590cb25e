"""What one RL job holds on its GPU at a config's shapes, measured on a CPU: the update's own
scoring code (scoring.completion_logprobs) runs on the meta device, a model built from the
paper model's architecture as probe.PAPER_ARCHITECTURES writes it out (nothing is downloaded, no
weight exists), and autograd's saved tensors are counted. To that come the parts whose size is their shape:

    weights, gradients, AdamW   fp32 master weights, their gradients, two moments: 16 bytes a weight
    reference                   a second fp32 copy when rl.beta > 0
    saved for backward          measured: the largest micro-batch's scoring pass under gradient
                                checkpointing (layer inputs and the fp32 log-softmax of its
                                completion tokens), each storage once, parameters aside
    recompute                   measured: one decoder layer's saved tensors on that micro-batch,
                                rebuilt while the backward pass goes through it
    head transients             2 x the fp32 (rows, tokens, V) log-softmax: the logits upcast
                                before it and the gradient flowing back into it
    vLLM                        rl.vllm.gpu_memory_utilization x the GPU's memory (launch.gpu_memory_gib),
                                with rl.engine: vllm (colocated in the training process)

The largest micro-batch is rl.micro_batch_tokens filled with rows of an assumed prompt
(PROMPT_TOKENS) plus a completion at the cap (rl.max_new_tokens): the longest rollouts packed
together, as scoring.micro_batches may pack them. On the meta device no value can be read, so
transformers' check whether the attention mask is all ones is answered "no" (it then builds the
mask: a slight overcount).

    estimate = update_memory(architecture, rl, gpu_memory_gib)   # an UpdateMemory, in bytes
    lines = config_lines(cfg)                                       # per model, for the dry run
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

GIB = 2**30
PROMPT_TOKENS = 512  # assumed: a system prompt and a question; the paper's data sets fit in ~300
CUDA_CONTEXT = 1 * GIB  # the CUDA context and allocator's slack, beside what tensors hold


@dataclass(frozen=True)
class UpdateMemory:
    parameters: int  # weights in the model
    weights_and_optimizer: int
    reference: int
    saved_for_backward: int
    recompute: int
    head_transients: int
    vllm: int
    rows: int  # rows in the largest micro-batch
    row_tokens: int  # prompt + completion tokens a row
    gpu: int  # the GPU's memory

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
            f"{name}: RL update {self.total / GIB:.1f} GiB of {self.gpu / GIB:.0f} GiB ({verdict}): "
            f"weights+grads+AdamW {self.weights_and_optimizer / GIB:.1f}, reference {self.reference / GIB:.1f}, "
            f"saved for backward {self.saved_for_backward / GIB:.1f} (micro-batch of {self.rows} x "
            f"{self.row_tokens} tokens), recompute {self.recompute / GIB:.1f}, head transients "
            f"{self.head_transients / GIB:.1f}, CUDA {CUDA_CONTEXT / GIB:.0f}, vLLM {self.vllm / GIB:.1f}"
        )

    def record(self) -> dict[str, Any]:
        return {**asdict(self), "training": self.training, "total": self.total, "fits": self.fits}


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


def saved_bytes(model: Any, rows: int, prompt: int, completion: int) -> int:
    """The bytes autograd keeps for backward when the update scores `rows` rows of `prompt` +
    `completion` tokens: each storage once, the model's parameters aside."""
    import torch

    from meml.training.scoring import completion_logprobs

    params = {p.untyped_storage()._cdata for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage._cdata not in params:
            seen.setdefault(storage._cdata, storage.nbytes())
        return t

    with _mask_checks_answered_no(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        completion_logprobs(model, [[1] * prompt] * rows, [[2] * completion] * rows, 0, with_entropy=True)
    return sum(seen.values())


def update_memory(architecture: dict[str, Any], rl: dict[str, Any], gpu_memory_gib: float) -> UpdateMemory:
    """The RL update's memory on one GPU (the module's docstring lists the parts). `rl`: the rl
    section with the data set's entry laid over it (its max_new_tokens, micro_batch_tokens, beta
    and vllm.gpu_memory_utilization are read)."""
    cap = int(rl["max_new_tokens"])
    row_tokens = PROMPT_TOKENS + cap
    rows = max(1, int(rl["micro_batch_tokens"]) // row_tokens)
    model = meta_model(architecture)
    parameters = sum(p.numel() for p in model.parameters())
    saved = saved_bytes(model, rows, PROMPT_TOKENS, cap)
    # one layer's activations, rebuilt during backward: a one-layer model without checkpointing
    # keeps them all; with checkpointing, only the layer's input (the difference is the layer)
    one = saved_bytes(meta_model(architecture, layers=1, checkpointing=False), rows, PROMPT_TOKENS, cap)
    one_checkpointed = saved_bytes(meta_model(architecture, layers=1), rows, PROMPT_TOKENS, cap)
    log_softmax = rows * cap * int(architecture["vocab_size"]) * 4
    gpu = int(gpu_memory_gib * GIB)
    return UpdateMemory(
        parameters=parameters,
        weights_and_optimizer=16 * parameters,
        reference=4 * parameters if float(rl.get("beta") or 0) > 0 else 0,
        saved_for_backward=saved,
        recompute=max(0, one - one_checkpointed),
        head_transients=2 * log_softmax,
        vllm=int(float(rl["vllm"]["gpu_memory_utilization"]) * gpu) if rl["engine"] == "vllm" else 0,
        rows=rows,
        row_tokens=row_tokens,
        gpu=gpu,
    )


def largest_cap_rl(cfg: dict[str, Any]) -> dict[str, Any]:
    """The rl settings (with its data set's entry) of the grid's data set with the largest answer cap."""
    from meml.core.config import dataset_rl

    return max((dataset_rl(cfg, ds) for ds in cfg["grid"]["datasets"]), key=lambda r: int(r["max_new_tokens"]))


def config_estimates(cfg: dict[str, Any]) -> dict[str, UpdateMemory]:
    """Per grid model, its RL update at the largest answer cap among the grid's data sets."""
    from meml.training.probe import architecture

    rl, gpu = largest_cap_rl(cfg), float(cfg["launch"]["gpu_memory_gib"])
    return {m: update_memory(architecture(cfg, m), rl, gpu) for m in cfg["grid"].get("models") or list(cfg["models"])}


def config_lines(cfg: dict[str, Any]) -> tuple[list[str], list[str]]:
    """config_estimates as (the lines the dry run prints, the refusals). A refusal names the keys
    that shrink the update."""
    lines, refusals = ["The RL update on one GPU, measured on the meta device (training/memory.py):"], []
    budget = largest_cap_rl(cfg)["micro_batch_tokens"]
    for model, memory in config_estimates(cfg).items():
        lines.append("  " + memory.line(model))
        if not memory.fits:
            refusals.append(
                f"models.{model}: the RL update needs {memory.total / GIB:.1f} GiB of launch.gpu_memory_gib "
                f"{memory.gpu / GIB:.0f}: lower rl.micro_batch_tokens (now {budget}) or "
                "rl.vllm.gpu_memory_utilization, or name a larger GPU"
            )
    return lines, refusals
