"""scripts/bench_rl.py --against drives another checkout through its CLI, which has stayed put,
so that it still runs against a588599, a commit from before the RL loop took typed settings (its
run_rl has no RLArgs). Skips where that commit is not in this clone's history."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
from pathlib import Path

import pytest
from conftest import PROJECT

from meml.data.experts import DEFAULT_PROMPTS
from meml.data.tiny_models import build_tiny_models, toy_corpus

pytestmark = pytest.mark.slow
OLD = "a588599"


def _bench() -> object:
    spec = importlib.util.spec_from_file_location("bench_rl", PROJECT / "scripts/bench_rl.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_runs_against_a_checkout_from_before_the_typed_settings(
    small_world: Path, tmp_path: Path
) -> None:
    known = subprocess.run(["git", "-C", str(PROJECT), "cat-file", "-e", f"{OLD}^{{commit}}"], capture_output=True)
    if known.returncode != 0:
        pytest.skip(f"commit {OLD} is not in this clone's history (a shallow clone)")
    checkout = tmp_path / "old"
    added = subprocess.run(["git", "-C", str(PROJECT), "worktree", "add", "--detach", str(checkout), OLD],
                           capture_output=True, text=True)  # fmt: skip
    assert added.returncode == 0, added.stderr
    try:
        assert "RLArgs" not in (checkout / "pipeline/meml/training/rl.py").read_text()  # the API that moved
        model = build_tiny_models(toy_corpus(small_world, DEFAULT_PROMPTS), tmp_path / "m", seed=0, vocab_size=400)
        data, experts = str(small_world / "data/gsm8k"), str(small_world / "experts/gsm8k")
        args = argparse.Namespace(model=str(model["qwen2"]), data=data, experts=experts, steps=1, tokens=8, buffer=4,
                                  threads=1)  # fmt: skip
        for kind in ("grpo", "meml"):
            result = _bench().measure_checkout(checkout, kind, args)  # type: ignore[attr-defined]
            assert result["kind"] == f"then-{kind}" and len(result["step_seconds"]) == 1
            assert result["step_seconds"][0] > 0 and result["completion_tokens_mean"] <= 8 + 1
            # the old checkout's own loop ran: it logged no sampler gap, which came later
            assert "reward/mean" in result["metric_names"] and "sampler_gap/mean" not in result["metric_names"]
    finally:
        subprocess.run(["git", "-C", str(PROJECT), "worktree", "remove", "--force", str(checkout)], capture_output=True)
