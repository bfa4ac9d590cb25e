"""The vLLM path on a CPU, through vLLM's CPU build (scripts/setup.sh installs it): the same greedy
tokens as the kv engine, the weight push after every RL step and its check (a skipped or partial
sync is caught), lm-eval's vLLM model scoring as the kv backend does, and an RL run under vLLM
killed and resumed to the uninterrupted run's bits. GPU users run the same release (the gpu extra)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import PROJECT
from safetensors.torch import load_file
from scripted import train
from transformers import AutoModelForCausalLM, AutoTokenizer

from meml.core.config import load_config
from meml.core.precision import resolve
from meml.core.records import read_records
from meml.data.experts import DEFAULT_PROMPTS, chat_messages
from meml.data.tiny_models import build_tiny_models, toy_corpus
from meml.training.kv_decode import KVEngine
from meml.training.rl import Method
from meml.training.rollout import Sampling, StaleWeightsError, check_synced, prompt_ids
from meml.training.rollout_vllm import LOGPROB_TOLERANCE, VLLMEngine, VLLMSettings
from meml.training.scoring import completion_logprobs

if platform.machine() != "x86_64":
    pytest.skip("vLLM's CPU build on PyPI is for x86_64", allow_module_level=True)

CONFIG = load_config()
VLLM = VLLMSettings.from_config({**CONFIG["rl"]["vllm"], "max_model_len": 1024})
CPU = resolve("cpu")


@pytest.fixture(scope="module")
def models(small_world: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("vllm_models")
    return build_tiny_models(toy_corpus(small_world, DEFAULT_PROMPTS), out, seed=0, vocab_size=500)


def _prompts(world: Path, tokenizer: Any, n: int = 16) -> list[list[int]]:
    records = read_records(world / "data/gsm8k/train.jsonl")[:n]
    return [prompt_ids(tokenizer, chat_messages(r, i % 3)) for i, r in enumerate(records)]


def _greedy_agreement(model_dir: Path, world: Path) -> tuple[int, int]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    prompts = _prompts(world, tokenizer)
    greedy = Sampling(48, greedy=True)
    kv = [g[0].token_ids for g in KVEngine(policy, tokenizer, 64, CPU).generate(prompts, 1, greedy)]
    environment = dict(os.environ)
    engine = VLLMEngine(model_dir, tokenizer, CPU, VLLM, seed=0)
    # the launcher's variables (and vLLM's own) are set while vLLM starts only: a later trl or
    # subprocess that saw RANK or LOCAL_RANK would take this process for one of several
    assert dict(os.environ) == environment
    vl = [g[0].token_ids for g in engine.generate(prompts, 1, greedy)]
    return sum(a == b for a, b in zip(kv, vl, strict=True)), len(prompts)


def test_settings_are_read_once_and_differ_by_device() -> None:
    assert VLLM.llm_kwargs("cpu") == {"max_model_len": 1024, "enforce_eager": True, "kv_cache_memory_bytes": 2**30}
    gpu = VLLM.llm_kwargs("cuda")
    assert gpu["enforce_eager"] is False and gpu["gpu_memory_utilization"] == 0.3 and "kv_cache_memory_bytes" not in gpu
    with pytest.raises(Exception, match=r"rl\.vllm\.cpu_kv_cache_gib"):
        VLLMSettings.from_config({"gpu_memory_utilization": 0.3, "max_model_len": 64, "enforce_eager": None})


def test_the_launcher_variables_last_while_vllm_starts_and_each_job_gets_its_own_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from meml.training.rollout_vllm import in_process

    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    before = dict(os.environ)
    ports = []
    for _ in range(2):
        with in_process():
            assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == ("0", "1")
            ports.append(int(os.environ["MASTER_PORT"]))
            os.environ["LD_PRELOAD"] = "set by vLLM's start"
        assert dict(os.environ) == before
    assert all(p > 0 for p in ports)  # a free port each time, never one fixed port that parallel jobs share
    monkeypatch.setenv("MASTER_PORT", "29611")  # under accelerate: its port is kept
    with in_process():
        assert os.environ["MASTER_PORT"] == "29611"


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_greedy_tokens_equal_the_kv_engines_on_both_tiny_families(
    family: str, models: dict[str, Path], small_world: Path
) -> None:
    same, total = _greedy_agreement(models[family], small_world)
    assert same == total, f"{family}: {same}/{total} greedy completions identical"


@pytest.mark.slow
def test_greedy_tokens_equal_the_kv_engines_on_smollm2(small_world: Path, tmp_path: Path) -> None:
    from test_real_model import _model_file

    from meml.data import gguf_models

    _model_file()  # fetched and checked once, or a skip that says why
    entry = load_config(PROJECT / "config/real-model.yaml")["models"]["smollm2"]
    folder = gguf_models.convert(gguf_models.parse(entry, "models.smollm2"), tmp_path / "smollm2")
    same, total = _greedy_agreement(folder, small_world)
    assert same == total, f"SmolLM2: {same}/{total} greedy completions identical"


class RecordingEngine(VLLMEngine):
    """The vLLM engine, keeping what each sync check measured."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.checks: list[tuple[dict[str, float], float, tuple[float, float]]] = []

    def verify(self, policy: Any) -> dict[str, float]:
        counts = super().verify(policy)
        total = sum(float(p.detach().double().sum()) for p in policy.parameters())
        self.checks.append((counts, self.logprob_gap(policy), (total, 0.0)))
        return counts


class ForgetfulEngine(VLLMEngine):
    def sync_weights(self, model: Any) -> None:
        pass  # the bug the loop must catch: rollouts from the weights vLLM loaded at the start


def _rl_settings(**changes: Any) -> dict[str, Any]:
    s = json.loads(json.dumps(CONFIG["rl"]))
    s.update(steps=3, questions_per_step=2, group_size=6, max_new_tokens=12, checkpoint_every=3,
             rollout_batch_size=36, max_truncated_share=1.0, engine="vllm")  # fmt: skip
    s["buffer"].update(capacity=2)  # a random model fails every question: the buffer flushes, the weights move
    s.update(changes)
    return s


def test_rl_steps_under_vllm_keep_its_log_probs_on_the_policys(
    models: dict[str, Path], small_world: Path, tmp_path: Path
) -> None:
    model_dir = models["qwen2"]
    method = Method.from_config("MEML-GRPO", CONFIG["methods"]["MEML-GRPO"])
    args = (method, model_dir, small_world / "data/gsm8k", small_world / "experts/gsm8k")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    engine = RecordingEngine(model_dir, tokenizer, CPU, VLLM, seed=0)
    summary = train(_rl_settings(), *args, tmp_path / "run", engine=engine, progress=False)
    assert summary["steps"] == 3
    # one check before the first step, one after each step's update
    assert len(engine.checks) == 4
    for counts, gap, _ in engine.checks:
        # embeddings, norms and biases compared exactly; the repacked linear weights by the probe's log-probs
        assert {k: counts[k] for k in ("exact", "by_logprobs")} == {"exact": 14, "by_logprobs": 16}
        assert counts["logprob_gap"] == gap <= LOGPROB_TOLERANCE["float32"]
    totals = [total for _, _, total in engine.checks]
    assert len(set(totals)) == 4, "the policy's weights did not move at every step: the check proved nothing"
    # vLLM reports each drawn token's log-prob after temperature (0.7 here) and top-p; the learner's,
    # at the same weights and temperature, agrees to the sync check's tolerance at every step
    rows = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["sampler_gap/max"] <= LOGPROB_TOLERANCE["float32"] for r in rows), rows
    # the sync check's own gap, logged every step: the one measured after that step's push
    assert [r["sync/logprob_gap"] for r in rows] == [counts["logprob_gap"] for counts, _, _ in engine.checks[1:]]
    assert all(r["sync/tensors_by_logprobs"] == 16.0 for r in rows)

    with pytest.raises(StaleWeightsError, match="VLLMEngine holds other weights"):
        train(_rl_settings(), *args, tmp_path / "stale", engine=ForgetfulEngine(model_dir, tokenizer, CPU, VLLM, 0),
               progress=False)  # fmt: skip
    assert not (tmp_path / "stale/DONE").exists()


def test_bf16_rl_steps_run_under_the_kv_engine_and_vllm(
    models: dict[str, Path], small_world: Path, tmp_path: Path
) -> None:
    """precision: bf16 on a CPU with bf16 arithmetic: training under autocast over fp32 master
    weights, vLLM sampling in bfloat16 and its sync check at the bf16 tolerance."""
    from meml.core.precision import cpu_has_bf16

    if not cpu_has_bf16():
        pytest.skip("this CPU has no bf16 arithmetic (AVX512-BF16 or AMX): precision bf16 is refused here")
    bf16 = resolve("cpu", "bf16")
    method = Method.from_config("MEML-GRPO", CONFIG["methods"]["MEML-GRPO"])
    # qwen2: its q/k/v biases, which vLLM's CPU kernels keep in fp32 while the weights are bf16
    args = (method, models["qwen2"], small_world / "data/gsm8k", small_world / "experts/gsm8k")
    for engine in ("kv", "vllm"):
        summary = train(_rl_settings(steps=2, engine=engine), *args, tmp_path / engine, precision=bf16, progress=False)
        assert summary["steps"] == 2 and summary["precision"] == "bfloat16"
        weights = load_file(str(next((tmp_path / engine / "model").glob("*.safetensors"))))
        assert all(t.dtype == torch.float32 for t in weights.values())  # the master weights stay fp32
        rows = [json.loads(x) for x in (tmp_path / engine / "metrics.jsonl").read_text().splitlines()]
        assert all(r["sampler_gap/max"] <= LOGPROB_TOLERANCE["bfloat16"] for r in rows), (engine, rows)


def test_a_sync_that_misses_the_repacked_weights_is_caught_by_log_probs(models: dict[str, Path]) -> None:
    """Tensors vLLM still holds as parameters arrive, the linear layers (repacked on a CPU) do not:
    the exact comparison passes and the probe's log-probs must catch it."""
    model_dir = models["llama"]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    engine = VLLMEngine(model_dir, tokenizer, CPU, VLLM, seed=0)
    check_synced(engine, policy)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if name.endswith("proj.weight"):
                p.mul_(1.01)  # 1%: a fraction of one toy optimiser step's effect on the log-probs
    kept = {n for n, p in engine.model().named_parameters() if p.numel() > 0}
    part = [(n, t) for n, t in policy.state_dict().items() if n in kept]
    engine.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": part, "is_checkpoint_format": True})
    with pytest.raises(StaleWeightsError, match="log-probs of the probe differ"):
        check_synced(engine, policy)
    engine.sync_weights(policy)
    check_synced(engine, policy)
    logp, _, _ = completion_logprobs(policy, [engine.probe[:1]], [engine.probe[1:]], pad=0)
    ours = engine.prompt_logprobs(engine.probe)
    assert max(abs(a - b) for a, b in zip(ours, logp[0].tolist(), strict=True)) <= LOGPROB_TOLERANCE["float32"]


def test_eval_backend_vllm_scores_as_the_kv_backend(models: dict[str, Path], small_world: Path) -> None:
    """lm-eval's own vLLM model (as lm-eval ships it) against the kv backend: the same responses,
    word for word, so the same accuracies. (A random model writes stray bytes: the kv backend
    decodes an incomplete UTF-8 sequence as U+FFFD, vLLM's detokenizer withholds it.)"""

    def text(report: dict[str, Any], k: str) -> list[str]:
        return [q[k]["response"].replace("\ufffd", "") for q in report["samples"]]

    from meml.evaluation.evaluate import evaluate_model

    common = {"limit": 6, "max_new_tokens": 24, "vllm": VLLM}
    kv = evaluate_model(models["qwen2"], "gsm8k", [0, 1], small_world / "data", backend="kv", **common)
    vl = evaluate_model(models["qwen2"], "gsm8k", [0, 1], small_world / "data", backend="vllm", **common)
    assert vl["backend"] == "vllm"
    for k in ("e0", "e1"):
        assert text(vl, k) == text(kv, k)
        assert vl["experts"][k]["lenient"] == kv["experts"][k]["lenient"]
        assert vl["experts"][k]["strict"] == kv["experts"][k]["strict"]
    assert vl["majority_vote"]["lenient"] == kv["majority_vote"]["lenient"]


def _worker(model: Path, world: Path, out: Path, store: str, fault: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{PROJECT / 'tests'}:{PROJECT / 'pipeline'}", "OMP_NUM_THREADS": "1"}
    args = [sys.executable, str(PROJECT / "tests/rl_worker.py"), str(model), str(world), str(out), store, fault, "vllm"]
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_an_rl_run_under_vllm_killed_and_resumed_equals_the_uninterrupted_one(
    models: dict[str, Path], small_world: Path, tmp_path: Path
) -> None:
    from meml.core.tracking import MLflowSettings, ensure_experiment

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ensure_experiment(MLflowSettings(store, "faults"))
    clean = _worker(models["qwen2"], small_world, tmp_path / "clean", store, "none")
    assert clean.returncode == 0, clean.stderr[-3000:]
    killed = _worker(models["qwen2"], small_world, tmp_path / "faulty", store, "rollouts:3")
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert not (tmp_path / "faulty/DONE").exists()
    resumed = _worker(models["qwen2"], small_world, tmp_path / "faulty", store, "none")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming" in resumed.stderr

    def metrics(run: Path) -> list[dict[str, Any]]:
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]

    assert metrics(tmp_path / "faulty") == metrics(tmp_path / "clean")
    a = load_file(str(next((tmp_path / "clean/model").glob("*.safetensors"))))
    b = load_file(str(next((tmp_path / "faulty/model").glob("*.safetensors"))))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "weights differ after resuming"


@pytest.mark.slow
def test_two_processes_under_accelerate_each_run_vllm_as_a_data_parallel_rank(
    models: dict[str, Path], small_world: Path, tmp_path: Path
) -> None:
    """The multi-GPU launch path on a CPU: accelerate starts two processes (gloo), each trains its
    replica on its share of the questions and samples from its own vLLM, which joins through the
    external launcher as one of two data-parallel ranks; the replicas and buffers stay identical."""
    import socket

    from meml.core.tracking import MLflowSettings, ensure_experiment

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ensure_experiment(MLflowSettings(store, "faults"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(PROJECT / "config/accelerate/cpu_gloo.yaml"), "--num_processes", "2", "--main_process_port", str(port),
           str(PROJECT / "tests/rl_worker.py"), str(models["qwen2"]), str(small_world), str(tmp_path / "run"), store,
           "none", "vllm"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{PROJECT / 'tests'}:{PROJECT / 'pipeline'}", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(r["dist/processes"] == 2 for r in rows)
    assert all(r["dist/replicas_identical"] == 1 and r["dist/buffers_identical"] == 1 for r in rows)
    assert (tmp_path / "run/DONE").is_file()
