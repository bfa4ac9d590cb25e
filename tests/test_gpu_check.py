"""The GPU check script's CPU part (the test suite has no GPU): it runs, measures, and says that
vLLM's CPU build passes the same checks a GPU will run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PROJECT

pytestmark = pytest.mark.slow  # `pytest -m "not slow"` for a quick round


def test_gpu_check_cpu_part(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    cmd = [sys.executable, str(PROJECT / "scripts/gpu_check.py"), "--cpu", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["precision"] == "float32" and report["group_size"] == 8
    rollouts = report["hf_rollouts"]
    assert rollouts["rollouts"] == 16 and rollouts["tokens_per_second"] > 0
    # the random model samples ids the tokenizer's training never filled, and they decode to text
    assert rollouts["vocabulary"] == rollouts["model_vocabulary"] == 4096
    assert rollouts["sampled_beyond_trained_ids"] > 0 and rollouts["decoded_text"] > 0
    for method, steps in (("MEML-GRPO", 2), ("MoE-SFT-GRPO", 1)):
        assert report[method]["steps"] == steps and report[method]["step_seconds"] > 0
        assert report[method]["peak_memory_gib"] is None and report[method]["update_memory_estimate_gib"] > 10
    vllm = report["vllm"]
    assert vllm["logprobs_agree"] and vllm["follows_new_weights"] and vllm["skipped_sync_caught"], vllm
    assert vllm["logprob_gap_same_tokens"] <= 1e-3 and 0 <= vllm["greedy_agreement"] <= 1
    assert vllm["tensors_checked_exactly"] > 0 and vllm["tensors_checked_by_logprobs"] > 0  # CPU: linears repacked
    assert vllm["logprob_gap_after_sync"] <= 1e-3 < vllm["logprob_gap_stale"]
    assert "| vLLM skipped_sync_caught | True |" in done.stdout and "| MEML-GRPO, 2 step(s) (G=8, Q=2) |" in done.stdout
    estimates = report["update_memory_estimate"]
    assert set(estimates) == {"qwen2", "llama"} and all(e["fits"] and e["rows"] == 4 for e in estimates.values())
    assert "| estimate at the paper's shapes | qwen2: RL update" in done.stdout


def test_a_tokenizer_padded_to_the_paper_vocabulary_decodes_every_id() -> None:
    """The probe's tokenizer at Qwen2.5's 151,936 ids: text tokenizes as without the padding, and
    an id the random model samples beyond the trained ones decodes to its name."""
    from meml.data.tiny_models import train_tokenizer

    corpus = ["What is 12 plus 7? <think>12 + 7 = 19</think> #### 19"] * 20
    plain, padded = (train_tokenizer(corpus, 300, pad_to=n) for n in (0, 151936))
    assert len(padded) == 151936 and len(plain) < 300
    text = "What is 12 plus 7? #### 19"
    assert padded(text)["input_ids"] == plain(text)["input_ids"]
    assert padded.decode([151935, len(plain)]) == f"<unused151935><unused{len(plain)}>"
    assert padded.decode(plain(text)["input_ids"]) == text
