"""The GPU check: one command, under 10 minutes on one GPU; seconds on a CPU.

    python scripts/gpu_check.py                 # GPU: Qwen2.5-Math-1.5B's architecture, random weights, bf16
    python scripts/gpu_check.py --cpu           # CPU: the tiny qwen2 model, fp32, short lengths

Without --cpu it refuses, exit 2, when the GPU cannot be used (core/cuda_check.py: torch's CUDA
build, the driver against it, torch.cuda.is_available()), saying why: a GPU check that quietly ran
the CPU's would pass on a machine whose GPU jobs will fail. --cpu is the only way to the CPU check.

(a) rollout tokens per second of the HF engine, and the time and peak memory of two MEML-GRPO
    steps and one GRPO step (MoE-SFT-GRPO) at G = 8 with the paper config's lengths, micro-batches
    and rollout engine (vLLM), beside the RL update's memory that training/memory.py measures for
    each paper model on the meta device (what the paper config's dry run prints); the tokenizer has
    the architecture's vocabulary (151,936 ids on a GPU, 4,096 on a CPU), so every id the random
    model samples decodes, as with a real model's tokenizer;
(b) where vLLM is importable (its GPU build, or its CPU build with --cpu; each engine closed before
    the next check starts): on the same weights,
    vLLM and the learner score the same tokens (the HF engine's greedy completions) within the
    sync check's tolerance for the precision (greedy agreement is reported beside it);
    after an optimiser step and a weight sync every weight arrived (VLLMEngine.verify) and vLLM's
    log-probabilities follow the new weights; a skipped sync is caught; vLLM's tokens per second.
Prints a table and writes it as JSON (--out). Parts that cannot run say why they were skipped.
"""

from __future__ import annotations

import argparse
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))

from meml.core.config import load_config
from meml.core.io import atomic_write_json
from meml.core.precision import of_config
from meml.core.records import read_records
from meml.data.experts import chat_messages
from meml.data.tiny_models import ARCHITECTURES
from meml.training.probe import PAPER_ARCHITECTURES, build_probe, timed_steps
from meml.training.rollout import HFEngine, Sampling, check_synced, prompt_ids

PAPER = Path(__file__).resolve().parents[1] / "config" / "paper.yaml"


def settings_for(cpu: bool, questions: int) -> dict[str, Any]:
    """The paper config's RL lengths on a GPU; the same shape, short, on a CPU."""
    cfg = load_config(PAPER)
    cfg["rl"].update(group_size=8, questions_per_step=questions, beta=0.0)
    if cpu:
        cfg.update(device="cpu", precision="fp32", gradient_checkpointing="auto")
        cfg["rl"].update(max_new_tokens=32, rollout_batch_size=64)
        cfg["rl"]["vllm"]["max_model_len"] = None  # the tiny model's own context (2048), not the paper's 4096
    cfg["mlflow"]["enabled"] = False
    return cfg


def update_memory_estimates() -> dict[str, Any]:
    """The paper config's RL update memory per model (training/memory.py), at its largest cap."""
    from meml.training.memory import config_estimates

    estimates = config_estimates(load_config(PAPER))
    return {model: {"line": memory.line(model), **memory.record()} for model, memory in estimates.items()}


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def hf_throughput(model_dir: Path, world: Path, cfg: dict[str, Any], n_prompts: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    precision = of_config(cfg)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(precision.device)
    engine = HFEngine(model, tokenizer, int(cfg["rl"]["rollout_batch_size"]), precision)
    records = read_records(world / "data/gsm8k/train.jsonl")[:n_prompts]
    prompts = [prompt_ids(tokenizer, chat_messages(r, 1)) for r in records]
    sampling = Sampling(int(cfg["rl"]["max_new_tokens"]), 1.0, 1.0)
    engine.generate(prompts[:1], 1, Sampling(8))  # warm-up
    started = time.time()
    out = engine.generate(prompts, 8, sampling)
    seconds = time.time() - started
    tokens = sum(len(c.token_ids) for group in out for c in group)
    # ids the tokenizer's training never filled (its <unused...> padding): the random model samples
    # them, and they must decode
    unused = {i for t, i in tokenizer.get_vocab().items() if t.startswith("<unused")}
    beyond = sum(i in unused for group in out for c in group for i in c.token_ids)
    return {"rollouts": 8 * len(prompts), "tokens": tokens, "seconds": round(seconds, 2),
            "tokens_per_second": round(tokens / seconds, 1), "vocabulary": len(tokenizer),
            "model_vocabulary": int(model.config.vocab_size), "sampled_beyond_trained_ids": beyond,
            "decoded_text": sum(len(c.text) for group in out for c in group)}  # fmt: skip


def vllm_checks(model_dir: Path, world: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    """(b): agreement, weight sync and its check, throughput; on a GPU, or on a CPU through vLLM's CPU build."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        return {"skipped": "vllm is not importable here (CPU: bash scripts/setup.sh; GPU: pip install -e .[gpu])"}
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from meml.training.rollout import StaleWeightsError
    from meml.training.rollout_vllm import LOGPROB_TOLERANCE, VLLMEngine, VLLMSettings
    from meml.training.scoring import completion_logprobs

    precision = of_config(cfg)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(precision.device)
    hf = HFEngine(policy, tokenizer, 64, precision)
    settings = VLLMSettings.from_config({**cfg["rl"]["vllm"], "max_model_len": None})
    started = time.time()
    engine = VLLMEngine(model_dir, tokenizer, precision, settings, seed=0)
    start_seconds = time.time() - started
    records = read_records(world / "data/gsm8k/train.jsonl")[:64]
    prompts = [prompt_ids(tokenizer, chat_messages(r, 1)) for r in records]
    greedy = Sampling(32, greedy=True)
    a = [g[0].token_ids for g in hf.generate(prompts, 1, greedy)]
    b = [g[0].token_ids for g in engine.generate(prompts, 1, greedy)]
    agree = sum(x == y for x, y in zip(a, b, strict=True)) / len(prompts)
    # the pass criterion: both score the same tokens alike. Greedy agreement is reported, not
    # required: two bf16 implementations round differently and a near-tie flips a whole tail
    # (report/example/gpu-path/precision_smollm2.json: about half agree between bf16 and fp32)
    same_tokens_gap = 0.0
    with torch.no_grad(), precision.autocast():
        for p, c in list(zip(prompts, a, strict=True))[:16]:
            ours = engine.prompt_logprobs(p + c)[-len(c) :]
            theirs, _, _ = completion_logprobs(policy, [p], [c], tokenizer.pad_token_id)
            same_tokens_gap = max(
                same_tokens_gap, *(abs(x - y) for x, y in zip(ours, theirs[0].float().tolist(), strict=True))
            )

    def step() -> None:  # one AdamW step that moves every weight
        optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4)
        with precision.autocast():
            logp, mask, _ = completion_logprobs(policy, [prompts[0]], [a[0]], tokenizer.pad_token_id)
        (-(logp * mask).sum()).backward()
        optimizer.step()
        optimizer.zero_grad()

    step()
    stale_gap = engine.logprob_gap(policy)
    started = time.time()
    engine.sync_weights(policy)
    sync_seconds = time.time() - started
    counts = engine.verify(policy)  # raises StaleWeightsError if any weight did not arrive
    synced_gap = engine.logprob_gap(policy)
    step()  # and a sync skipped: the check must see it
    try:
        check_synced(engine, policy)
        skipped_sync_caught = False
    except StaleWeightsError:
        skipped_sync_caught = True
    engine.sync_weights(policy)

    sampling = Sampling(int(cfg["rl"]["max_new_tokens"]), 1.0, 1.0)
    started = time.time()
    out = engine.generate(prompts[: int(cfg["rl"]["questions_per_step"])], 8, sampling)
    seconds = time.time() - started
    tokens = sum(len(c.token_ids) for g in out for c in g)
    engine.close()  # its weights and KV cache given back before whatever runs next in this process
    return {
        "start_seconds": round(start_seconds, 1),
        "greedy_agreement": round(agree, 3),
        "logprob_gap_same_tokens": round(same_tokens_gap, 6),
        "logprobs_agree": same_tokens_gap <= LOGPROB_TOLERANCE[precision.dtype],
        "sync_seconds": round(sync_seconds, 2),
        "tensors_checked_exactly": counts["exact"],
        "tensors_checked_by_logprobs": counts["by_logprobs"],
        "logprob_gap_after_sync": round(synced_gap, 6),
        "logprob_gap_stale": round(stale_gap, 6),
        "follows_new_weights": synced_gap < stale_gap,
        "skipped_sync_caught": skipped_sync_caught,
        "tokens_per_second": round(tokens / seconds, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="the tiny model on the CPU (what the test suite runs)")
    parser.add_argument("--questions", type=int, default=None, help="questions a step (GPU: the paper's 32; CPU 2)")
    parser.add_argument("--out", default="results/gpu_check.json")
    args = parser.parse_args()
    import torch

    if not args.cpu:
        from meml.core.cuda_check import check

        found = check()
        if found:
            for problem in found:
                print(f"gpu_check: no usable GPU: {problem}", file=sys.stderr)
            print("gpu_check: refused; `--cpu` runs the CPU check (the tiny model) instead", file=sys.stderr)
            return 2
    cpu = args.cpu
    questions = args.questions or (2 if cpu else int(load_config(PAPER)["rl"]["questions_per_step"]))
    cfg = settings_for(cpu, questions)
    arch_name = "tiny qwen2" if cpu else "Qwen/Qwen2.5-Math-1.5B"
    # on a CPU the tiny model, with a vocabulary of 4,096 ids (500 trained, the rest padding) for the
    # same decoding path as the paper's 151,936 at a size a CPU scores quickly
    arch = {**ARCHITECTURES["qwen2"], "vocab_size": 4096} if cpu else PAPER_ARCHITECTURES["Qwen/Qwen2.5-Math-1.5B"]
    device = "CPU: " + (platform.processor() or platform.machine()) if cpu else torch.cuda.get_device_name(0)
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "device": device,
        "model": f"{arch_name} architecture, random weights",
        "precision": of_config(cfg).dtype,
        "group_size": 8,
        "questions_per_step": questions,
        "max_new_tokens": cfg["rl"]["max_new_tokens"],
    }
    report["update_memory_estimate"] = update_memory_estimates()
    with tempfile.TemporaryDirectory() as tmp:
        world, model_dir = build_probe(Path(tmp) / "probe", arch)
        report["hf_rollouts"] = hf_throughput(model_dir, world, cfg, questions)
        estimate = report["update_memory_estimate"]["qwen2"]["total"] / 2**30
        for method, steps in (("MEML-GRPO", 2), ("MoE-SFT-GRPO", 1)):
            run = timed_steps(cfg, method, world, model_dir, Path(tmp) / method, steps=steps)
            step = run["rows"][-1]
            report[method] = {
                "steps": steps,
                "step_seconds": round(step["perf/step_seconds"], 2),
                "rollout_seconds": round(step["perf/rollout_seconds"], 2),
                "peak_memory_gib": round(run["peak_gib"], 2) if run["peak_gib"] is not None else None,
                # the meta-device estimate of the paper's update (its largest cap), for the peak beside it
                "update_memory_estimate_gib": round(estimate, 2),
                "peak_rss_gib": round(peak_rss_gib(), 2),
            }
        report["vllm"] = vllm_checks(model_dir, world, cfg)
    atomic_write_json(Path(args.out), report)
    print(f"GPU check, {report['date']}, {report['device']}, {report['model']}, {report['precision']}")
    print("| check | value |\n| --- | --- |")
    hf_rollouts = report["hf_rollouts"]
    print(f"| HF engine rollouts | {hf_rollouts['rollouts']} x up to {report['max_new_tokens']} tokens: "
          f"{hf_rollouts['tokens_per_second']} tokens/s |")  # fmt: skip
    print(f"| vocabulary | tokenizer {hf_rollouts['vocabulary']:,} ids, model {hf_rollouts['model_vocabulary']:,}; "
          f"{hf_rollouts['sampled_beyond_trained_ids']} sampled ids beyond the trained ones, decoded |")  # fmt: skip
    for method in ("MEML-GRPO", "MoE-SFT-GRPO"):
        r = report[method]
        memory = (
            f"peak GPU memory {r['peak_memory_gib']} GiB (estimate {r['update_memory_estimate_gib']} GiB)"
            if r["peak_memory_gib"] is not None
            else ""
        )
        print(f"| {method}, {r['steps']} step(s) (G=8, Q={questions}) | last step {r['step_seconds']} s "
              f"(rollouts {r['rollout_seconds']} s) {memory} peak RSS {r['peak_rss_gib']} GiB |")  # fmt: skip
    for key, value in report["vllm"].items():
        print(f"| vLLM {key} | {value} |")
    for estimate in report["update_memory_estimate"].values():
        print(f"| estimate at the paper's shapes | {estimate['line']} |")
    print(f"written: {args.out}")
    failed = any(
        report["vllm"].get(k) is False for k in ("logprobs_agree", "follows_new_weights", "skipped_sync_caught")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
