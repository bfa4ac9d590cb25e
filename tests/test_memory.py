"""The RL update's memory at the paper's shapes, measured on a CPU (training/memory.py): the meta
device counts what real tensors would hold, the paper config fits its GPU, and a config whose
update would not fit is refused by its dry run before any job, naming the key to change."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
    assert refusals == [] and len(lines) == 3 and all("(fits)" in line for line in lines[1:])
    rl = {**cfg["rl"], "max_new_tokens": 2048}
    qwen = update_memory(PAPER_ARCHITECTURES["Qwen/Qwen2.5-Math-1.5B"], rl, 80)
    assert qwen.rows == 3 and 1.5e9 < qwen.parameters < 1.6e9
    assert qwen.fits and qwen.saved_for_backward > 4 * GIB  # three rows of 2,048 tokens over 151,936 ids
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
