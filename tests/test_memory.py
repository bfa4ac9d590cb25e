"""The RL update's memory at the paper's shapes, measured on a CPU (training/memory.py): the meta
device counts what real tensors would hold, the paper config fits its GPU, and a config whose
update would not fit is refused by its dry run before any job, naming the key to change."""

from __future__ import annotations

import os
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import PROJECT

from meml.core.config import load_config
from meml.data.tiny_models import ARCHITECTURES
from meml.training.memory import GIB, config_lines, meta_model, saved_bytes, update_memory
from meml.training.probe import PAPER_ARCHITECTURES

PAPER = PROJECT / "config" / "paper.yaml"


def test_the_meta_device_counts_what_real_tensors_hold() -> None:
    """The same scoring pass on the tiny architecture with real weights and on the meta device keeps
    the same bytes for backward."""
    from transformers import AutoConfig, AutoModelForCausalLM

    arch = dict(ARCHITECTURES["qwen2"])
    model_type = arch.pop("model_type")
    torch.manual_seed(0)
    real = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **arch)).train()
    real.gradient_checkpointing_enable()
    meta = meta_model(ARCHITECTURES["qwen2"])
    for rows, prompt, completion in [(1, 5, 40), (3, 12, 7)]:
        assert saved_bytes(meta, rows, prompt, completion) == saved_bytes(real, rows, prompt, completion)


def test_the_paper_update_fits_an_80_gb_gpu_in_micro_batches_and_not_in_one_shot() -> None:
    cfg = load_config(PAPER)
    lines, refusals = config_lines(cfg)
    print("\n".join(lines))
    # per model its RL update's worst micro-batch and its SFT batch
    assert refusals == [] and len(lines) == 5 and all("(fits)" in line for line in lines[1:])
    assert sum(": RL update " in line for line in lines) == 2 and sum(": SFT " in line for line in lines) == 2
    rl = {**cfg["rl"], "max_new_tokens": 2048}
    qwen = update_memory(PAPER_ARCHITECTURES["Qwen/Qwen2.5-Math-1.5B"], rl, 80)
    # 8,192 padded tokens: four rows of 2,048 with 2,047 completion tokens hold more than three at the cap
    assert (qwen.rows, qwen.row_tokens, qwen.completion) == (4, 2048, 2047) and 1.5e9 < qwen.parameters < 1.6e9
    assert qwen.fits and qwen.saved_for_backward > 4 * GIB  # 8,188 completion tokens over 151,936 ids
    # the head's transients: three fp32 copies of the pass's (rows, tokens, V) log-softmax with the entropy's
    assert qwen.head_transients == 3 * 4 * 2047 * 151936 * 4
    # the whole step in one micro-batch (the old update: 256 rollouts, every pass kept until one backward)
    whole = update_memory(PAPER_ARCHITECTURES["Qwen/Qwen2.5-Math-1.5B"], {**rl, "micro_batch_tokens": 256 * 2560}, 80)
    assert not whole.fits and whole.saved_for_backward > 300 * GIB


def test_a_dry_run_refuses_an_update_that_does_not_fit(tmp_path: Path) -> None:
    too_big = tmp_path / "big.yaml"
    too_big.write_text("rl:\n  micro_batch_tokens: 200000\n")
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(PROJECT / "Snakefile"), "--directory", str(tmp_path)]
    cmd += ["--cores", "1", "-n", "--configfile", str(PAPER), str(too_big)]
    env = {**os.environ, "HF_TOKEN": "hf_placeholder"}
    dry = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert dry.returncode != 0
    said = dry.stdout + dry.stderr
    assert "fix first:" in said and "the RL update needs" in said and "lower rl.micro_batch_tokens (now 200000)" in said
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("gpu", [40, 80])
def test_the_verdict_follows_the_gpu(gpu: int) -> None:
    rl = {**load_config(PAPER)["rl"], "max_new_tokens": 2048}
    memory = update_memory(PAPER_ARCHITECTURES["Qwen/Qwen2.5-Math-1.5B"], rl, gpu)
    assert memory.fits == (gpu == 80)  # 23 GiB of weights and optimiser beside vLLM's 30% leave 40 GB short


def _live_peak(fn: Any, model: Any) -> int:
    """The most bytes held at once by tensors created while `fn` runs (each storage once, from its
    allocation until its last tensor is gone; the model's weights and buffers aside): forward, saved
    tensors, transients and gradients. Storages keep their Python object while alive, so a
    finalizer on it marks the free."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    weights = [*model.parameters(), *model.buffers()]
    live: set[int] = {id(w.untyped_storage()) for w in weights}  # there before: never counted
    held = [0, 0]  # now, peak

    def freed(key: int, size: int) -> None:
        live.discard(key)
        held[0] -= size

    class Track(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and id(t.untyped_storage()) not in live:
                    storage = t.untyped_storage()
                    live.add(id(storage))
                    held[0] += storage.nbytes()
                    held[1] = max(held)
                    weakref.finalize(storage, freed, id(storage), storage.nbytes())
            return out

    with Track():
        fn()
    return held[1]


def test_the_estimate_holds_every_micro_batch_of_a_capped_rollout_among_short_ones() -> None:
    """One subgroup of eight rollouts of a 12-token prompt: one at the 48-token cap, seven of 4
    tokens. Their own tokens (172) fit a 192-token budget, so counting them made one micro-batch that
    the pass pads to 8 x 60 positions; counted padded, the short rows go together and the capped one
    alone. On the tiny qwen2 architecture (4,096 ids) with real weights under gradient checkpointing:
    the estimator's worst micro-batch keeps exactly what saved-tensor hooks count on it; every
    micro-batch the packer makes keeps no more; and the peak of all the tensors the first update
    holds on it (scored with the entropy, then back-propagated) is within the estimate's saved,
    recompute and head parts. The one micro-batch the old count allowed is over both."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from meml.training.scoring import completion_logprobs, micro_batches, padded_tokens
    from tests.test_update import _saved_bytes_peak

    arch = {**ARCHITECTURES["qwen2"], "vocab_size": 4096}
    cap, budget = 48, 192
    config = dict(arch)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(config.pop("model_type"), **config)).train()
    model.gradient_checkpointing_enable()
    prompts = [list(range(3, 15))] * 8
    completions = [[5] * cap] + [[6] * 4] * 7
    assert sum(len(p) + len(c) for p, c in zip(prompts, completions, strict=True)) == 172 <= budget
    batches = micro_batches(prompts, completions, budget, whole=True)
    assert batches == [[1, 2, 3, 4, 5, 6, 7], [0]]
    assert [padded_tokens([prompts[r] for r in b], [completions[r] for r in b], True) for b in batches] == [112, 60]
    rl = {"max_new_tokens": cap, "micro_batch_tokens": budget, "beta": 0.0, "engine": "kv",
          "vllm": {"gpu_memory_utilization": 0.3}}  # fmt: skip
    estimate = update_memory(arch, rl, 80, prompt=12)
    assert (estimate.rows, estimate.row_tokens, estimate.completion) == (4, 48, 47)  # four rows just below the cap
    worst = estimate.row_tokens - estimate.completion
    assert saved_bytes(model, estimate.rows, worst, estimate.completion) == estimate.saved_for_backward
    grads = 4 * sum(p.numel() for p in model.parameters())  # counted with the weights, not here

    def saved(rows: list[int]) -> int:
        return _saved_bytes_peak(
            lambda: completion_logprobs(model, [prompts[r] for r in rows], [completions[r] for r in rows], 0,
                                        with_entropy=True), model)  # fmt: skip

    def update(rows: list[int]) -> None:
        logp, mask, _ = completion_logprobs(model, [prompts[r] for r in rows], [completions[r] for r in rows], 0,
                                            with_entropy=True)  # fmt: skip
        (logp * mask).sum().backward()

    held = estimate.saved_for_backward + estimate.recompute + estimate.head_transients
    for rows in batches:
        assert saved(rows) <= estimate.saved_for_backward
        model.zero_grad(set_to_none=True)
        assert _live_peak(lambda rows=rows: update(rows), model) - grads <= held, rows
    one_shot = list(range(8))
    model.zero_grad(set_to_none=True)
    peak = _live_peak(lambda: update(one_shot), model) - grads
    print(f"estimate {estimate.saved_for_backward} saved, {held} held; old micro-batch {saved(one_shot)}, {peak}")
    assert saved(one_shot) > estimate.saved_for_backward and peak > held


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_the_sft_estimate_counts_what_trls_fused_head_keeps(kind: str) -> None:
    """SFT on a GPU computes its loss through trl's fused LM head (SFTTrainer, trl 1.16), which never
    builds the (positions, V) logits. On the tiny architecture with real weights under gradient
    checkpointing, the estimate (the decoder measured on the meta device, the head by its shape)
    keeps exactly what saved-tensor hooks count through trl's own head."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from meml.training.memory import _counting_saved, sft_saved_bytes

    arch = {**ARCHITECTURES[kind], "vocab_size": 1024}
    config = dict(arch)
    torch.manual_seed(0)
    real = AutoModelForCausalLM.from_config(AutoConfig.for_model(config.pop("model_type"), **config)).train()
    real.gradient_checkpointing_enable()
    add_fused_lm_head(real, outputs=("log_probs", "entropy", "is_top1"))  # as SFTTrainer does
    rows, tokens = 3, 40
    ids = torch.randint(3, 1000, (rows, tokens))
    with _counting_saved(real) as seen:
        real(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids, fused_lm_head=True, use_cache=False)
    assert sft_saved_bytes(meta_model(arch), rows, tokens) == sum(seen.values())
