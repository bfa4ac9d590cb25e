"""Rollout engines without a GPU: one sampling setting for both engines, one precision for every
stage, the weight sync and its stale-weights check (with the HF copy engine standing in for
vLLM), and a clear error when vLLM is absent."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from scripted import train
from transformers import AutoModelForCausalLM, AutoTokenizer

from meml.core.config import load_config
from meml.core.io import DataError
from meml.core.precision import resolve
from meml.data.experts import DEFAULT_PROMPTS
from meml.data.tiny_models import build_tiny_models, toy_corpus
from meml.training.engines import make_engine
from meml.training.rl import Method
from meml.training.rollout import (
    HFCopyEngine,
    HFEngine,
    Sampling,
    StaleWeightsError,
    check_synced,
    hf_generation_kwargs,
    vllm_sampling_kwargs,
)
from meml.training.rollout_vllm import VLLMSettings

CONFIG = load_config()


@pytest.fixture(scope="module")
def model_dir(small_world: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("engine_models")
    return build_tiny_models(toy_corpus(small_world, DEFAULT_PROMPTS), out, seed=0, vocab_size=500)["qwen2"]


def test_both_engines_read_one_sampling_setting() -> None:
    sampled = Sampling(max_new_tokens=64, temperature=0.7, top_p=0.9)
    hf, vl = hf_generation_kwargs(sampled), vllm_sampling_kwargs(sampled, n=3)
    assert (hf["temperature"], hf["top_p"], hf["max_new_tokens"], hf["do_sample"]) == (0.7, 0.9, 64, True)
    assert (vl["temperature"], vl["top_p"], vl["max_tokens"], vl["n"]) == (0.7, 0.9, 64, 3)
    assert hf["top_k"] == 0 and "top_k" not in vl  # top-k off in both
    greedy = Sampling(max_new_tokens=16, greedy=True)
    assert hf_generation_kwargs(greedy) == {"max_new_tokens": 16, "do_sample": False}
    assert vllm_sampling_kwargs(greedy, 1)["temperature"] == 0.0


def test_precision_is_one_decision_for_every_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    from meml.core import precision
    from meml.training.rollout_vllm import VLLMSettings, llm_kwargs
    from meml.training.sft import device_settings

    VLLM = VLLMSettings.from_config(load_config()["rl"]["vllm"])  # rl.vllm, read once

    cpu, gpu = resolve("cpu"), resolve("cuda")
    assert (cpu.dtype, cpu.gradient_checkpointing) == ("float32", False)
    assert (gpu.dtype, gpu.gradient_checkpointing) == ("bfloat16", True)
    assert device_settings(cpu) == {"use_cpu": True, "bf16": False, "fp16": False, "gradient_checkpointing": False}
    assert device_settings(gpu)["bf16"] and device_settings(gpu)["gradient_checkpointing"]
    # the vLLM engine samples in the run's dtype, as the HF engine does
    assert llm_kwargs("m", gpu, VLLM, 0)["dtype"] == gpu.dtype == HFEngine(None, _Tok(), 1, gpu).dtype
    assert llm_kwargs("m", resolve("cuda", "fp32"), VLLM, 0)["dtype"] == "float32"
    assert llm_kwargs("m", cpu, VLLM, 0)["kv_cache_memory_bytes"] == 2**30  # on a CPU: its own KV cache size
    # bf16 on a CPU where it has bf16 arithmetic; refused where torch would emulate it
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)
    cpu_bf16 = resolve("cpu", "bf16")
    assert (cpu_bf16.dtype, cpu_bf16.gradient_checkpointing) == ("bfloat16", False)
    assert llm_kwargs("m", cpu_bf16, VLLM, 0)["dtype"] == "bfloat16"
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: False)
    with pytest.raises(DataError, match="'precision'"):
        resolve("cpu", "bf16")


class _Tok:
    eos_token_id = pad_token_id = 0

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return ["<eos>" for _ in ids]


def test_copy_engine_is_stale_until_synced(model_dir: Path) -> None:
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    engine = HFCopyEngine(policy, AutoTokenizer.from_pretrained(model_dir), 8)
    check_synced(engine, policy)  # a fresh copy holds the policy's weights
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    policy(input_ids=torch.tensor([[5, 6, 7]]), labels=torch.tensor([[5, 6, 7]])).loss.backward()
    optimizer.step()
    with pytest.raises(StaleWeightsError, match="stale policy"):
        check_synced(engine, policy)
    engine.sync_weights(policy)
    assert check_synced(engine, policy) == {"sync/fingerprint_equal": 1.0}  # the step's sync/* metric
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.equal(engine.model(input_ids=ids).logits, policy(input_ids=ids).logits)
    # a sync that misses one linear weight (the norms arrive) is caught: the check covers every tensor
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if name.endswith("layers.1.self_attn.q_proj.weight"):
                p.add_(1e-3)
    engine.model.load_state_dict({n: t for n, t in policy.state_dict().items() if "q_proj" not in n}, strict=False)
    with pytest.raises(StaleWeightsError, match="stale policy"):
        check_synced(engine, policy)


class ForgetfulEngine(HFCopyEngine):
    """A weight sync that silently does nothing: the bug the loop must catch."""

    def sync_weights(self, model: object) -> None:
        pass


def _settings(**changes: object) -> dict:
    s = json.loads(json.dumps(CONFIG["rl"]))
    s.update(
        steps=2,
        questions_per_step=2,
        group_size=6,
        max_new_tokens=8,
        checkpoint_every=2,
        rollout_batch_size=16,
        max_truncated_share=1.0,
    )
    s.update(changes)
    return s


def test_rl_with_a_synced_copy_runs_and_a_stale_copy_stops(small_world: Path, model_dir: Path, tmp_path: Path) -> None:
    method = Method.from_config("MEML-GRPO", CONFIG["methods"]["MEML-GRPO"])
    args = (method, model_dir, small_world / "data/gsm8k", small_world / "experts/gsm8k")
    summary = train(_settings(engine="hf-copy"), *args, tmp_path / "synced", progress=False)
    assert summary["steps"] == 2 and summary["precision"] == "float32"
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with pytest.raises(StaleWeightsError, match="ForgetfulEngine holds other weights"):
        train(_settings(), *args, tmp_path / "stale", engine=ForgetfulEngine(policy, tokenizer, 16), progress=False)
    # it stops at the first update that changed the weights (a step without any reward signal
    # leaves them as they were, and the copy is not stale yet): never a finished run
    metrics = tmp_path / "stale" / "metrics.jsonl"
    assert not (tmp_path / "stale" / "DONE").exists()
    assert len(metrics.read_text().splitlines() if metrics.exists() else []) < 2


def test_without_vllm_the_project_imports_and_the_engine_explains(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess

    from conftest import PROJECT

    # importing the training modules never imports vLLM (a fresh interpreter: this one may hold it)
    names = ["meml.training.rollout_vllm", "meml.training.engines", "meml.training.rl", "meml.plan.cost",
             "meml.training.probe"]  # fmt: skip
    code = f"import importlib, sys; [importlib.import_module(n) for n in {names}]; assert 'vllm' not in sys.modules"
    done = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(PROJECT / "pipeline")}, timeout=120)
    assert done.returncode == 0
    monkeypatch.setitem(sys.modules, "vllm", None)  # vLLM absent: its import fails
    vllm = VLLMSettings.from_config(CONFIG["rl"]["vllm"])
    with pytest.raises(DataError, match=r"needs vLLM.*scripts/setup\.sh.*pip install -e \.\[gpu\]"):
        make_engine("vllm", None, model_dir, None, 16, vllm, resolve("cpu"), seed=0)
    with pytest.raises(DataError, match=r"'rl\.engine'"):
        make_engine("sglang", None, model_dir, None, 16, vllm, resolve("cpu"), seed=0)


def test_vllm_completions_are_the_tokens_it_drew_with_their_logprobs() -> None:
    """A turn vLLM stopped on an end-of-sequence id the stop list lacks (Llama-3.2's <|eom_id|>,
    listed in its generation config) ends with that id: no end-of-turn token is appended that the
    policy never sampled. Each token's log-prob is the drawn one's."""
    from types import SimpleNamespace

    from meml.training.rollout_vllm import completion_of

    class Tok:
        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            return " ".join(str(i) for i in ids if not (skip_special_tokens and i >= 900))

    eom = 908  # a special id outside stops.py's list
    steps = [
        {5: SimpleNamespace(logprob=-0.5)},
        {6: SimpleNamespace(logprob=-1.25)},
        {eom: SimpleNamespace(logprob=-2.0)},
    ]
    stopped = SimpleNamespace(token_ids=[5, 6, eom], logprobs=steps, finish_reason="stop")
    c = completion_of(stopped, Tok())
    assert c.token_ids == [5, 6, eom] and c.finished and c.text == "5 6"
    assert c.logprobs == (-0.5, -1.25, -2.0)
    cut = SimpleNamespace(token_ids=[5, 6], logprobs=steps[:2], finish_reason="length")
    assert completion_of(cut, Tok()).token_ids == [5, 6] and not completion_of(cut, Tok()).finished
    assert completion_of(SimpleNamespace(token_ids=[5], logprobs=None, finish_reason="stop"), Tok()).logprobs is None
