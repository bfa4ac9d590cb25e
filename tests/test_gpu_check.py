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
    assert report["hf_rollouts"]["rollouts"] == 16 and report["hf_rollouts"]["tokens_per_second"] > 0
    for method in ("MEML-GRPO", "MoE-SFT-GRPO"):
        assert report[method]["step_seconds"] > 0 and report[method]["peak_memory_gib"] is None
    vllm = report["vllm"]
    assert vllm["logprobs_agree"] and vllm["follows_new_weights"] and vllm["skipped_sync_caught"], vllm
    assert vllm["logprob_gap_same_tokens"] <= 1e-3 and 0 <= vllm["greedy_agreement"] <= 1
    assert vllm["tensors_checked_exactly"] > 0 and vllm["tensors_checked_by_logprobs"] > 0  # CPU: linears repacked
    assert vllm["logprob_gap_after_sync"] <= 1e-3 < vllm["logprob_gap_stale"]
    assert "| vLLM skipped_sync_caught | True |" in done.stdout and "| one MEML-GRPO step (G=8, Q=2) |" in done.stdout
    estimates = report["update_memory_estimate"]
    assert set(estimates) == {"qwen2", "llama"} and all(e["fits"] and e["rows"] == 3 for e in estimates.values())
    assert "| estimate at the paper's shapes | qwen2: RL update" in done.stdout
