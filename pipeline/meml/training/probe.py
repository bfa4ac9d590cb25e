"""Short measured runs on models with the grid's architectures and random weights.

Nothing can be downloaded on the machines this project runs on, and the cost of a step depends on
the architecture and the lengths, not on the weights. So a probe builds the model from the
architecture written out below (or a tiny model's), a small toy world for prompts and answers,
and runs the real RL loop for a few steps. `meml cost --measure` turns the timings into
throughputs; scripts/gpu_check.py prints them with peak memory.

The two architectures are Qwen2.5-Math-1.5B's and Llama-3.2-1B-Instruct's published configs
(hidden sizes, layers, heads, vocabularies, RoPE settings).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from meml.core.io import DataError

PAPER_ARCHITECTURES: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-Math-1.5B": {
        "model_type": "qwen2",
        "vocab_size": 151936,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
    },
    "meta-llama/Llama-3.2-1B-Instruct": {
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
    },
}


def architecture(cfg: dict[str, Any], model: str) -> dict[str, Any]:
    """A grid model's architecture: a tiny model's, or the paper model's it is named after."""
    from meml.data.tiny_models import ARCHITECTURES, tiny_arch

    arch = tiny_arch(cfg, model)
    if arch is not None:
        return dict(ARCHITECTURES[arch])
    source = str(cfg["models"][model]["source"])
    if source not in PAPER_ARCHITECTURES:
        known = ", ".join(PAPER_ARCHITECTURES)
        raise DataError(f"no architecture written out for '{source}' (known: {known})", None, None, "models")
    return dict(PAPER_ARCHITECTURES[source])


def build_probe(root: Path, arch: dict[str, Any], seed: int = 0) -> tuple[Path, Path]:
    """A small toy world and a random-weight model of `arch` with the toy tokenizer, padded to the
    architecture's vocabulary (`train_tokenizer`'s pad_to), so that every id the random model samples
    decodes; returns (world folder, model folder)."""
    from meml.data.experts import DEFAULT_PROMPTS
    from meml.data.tiny_models import model_from_architecture, save_atomically, toy_corpus, train_tokenizer
    from meml.data.toy.world import build_world

    world = root / "world"
    build_world(world, seed, {"gsm8k": (64, 8)})
    corpus = toy_corpus(world, DEFAULT_PROMPTS[:3])
    tokenizer = train_tokenizer(corpus, vocab_size=500, pad_to=int(arch.get("vocab_size") or 0))
    model = model_from_architecture(arch, tokenizer, seed)
    save_atomically(root / "model", tokenizer, model)
    return world, root / "model"


def timed_steps(
    cfg: dict[str, Any], method: str, world: Path, model_dir: Path, out: Path, steps: int, **changes: Any
) -> dict[str, Any]:
    """`steps` RL steps of `method` (its config settings, with `changes`), timed; the first step
    warms up and is left out of the means when there are more. Returns the per-step metrics and
    the means, plus peak accelerator memory on a GPU."""
    import torch

    from meml.core.config import method_rl
    from meml.core.precision import of_config
    from meml.training.rl import Method, RLArgs, RLPaths, RLSettings, run_rl

    precision = of_config(cfg)
    # a throughput probe on a random-weight model: its length cap is a choice, not a truncation risk
    settings = {
        **method_rl(cfg, method),
        "max_truncated_share": 1.0,
        **changes,
        "steps": steps,
        "checkpoint_every": steps,
    }
    if precision.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    started = time.time()
    run_rl(
        RLArgs(
            RLSettings.from_config(settings), Method.from_config(method, cfg["methods"][method]), precision=precision
        ),
        RLPaths(model_dir, world / "data" / "gsm8k", world / "experts" / "gsm8k", out),
        progress=False,
    )
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
    timed = rows[1:] if len(rows) > 1 else rows
    mean = {k: statistics.fmean(r[k] for r in timed) for k in timed[0] if isinstance(timed[0][k], float)}
    peak = torch.cuda.max_memory_allocated() / 2**30 if precision.device == "cuda" else None
    return {"rows": rows, "mean": mean, "seconds": time.time() - started, "peak_gib": peak}


def measure_throughput(cfg: dict[str, Any], models: list[str], work: Path, steps: int = 3) -> dict[str, dict[str, Any]]:
    """Per model named (the grid's), from `steps` MoE-SFT-GRPO steps (the first one warm-up) on a random-weight model
    of its architecture at the config's RL settings and lengths: where it was measured (`source`),
    sampled tokens a second (`generate`), trained tokens a second (`train`), and `notes`. (GRPO's
    plain passes: the estimate, plan/cost.py, adds IML's and the reference model's on top.)"""
    import platform

    out: dict[str, dict[str, Any]] = {}
    for model in models:
        world, model_dir = build_probe(work / model, architecture(cfg, model), cfg["seed"])
        m = timed_steps(cfg, "MoE-SFT-GRPO", world, model_dir, work / model / "rl", steps)["mean"]
        rollouts = m["rollouts/sampled"]
        generated = rollouts * m["completion/length_mean"]
        trained = rollouts * (m["prompt/length_mean"] + m["completion/length_mean"])
        training_seconds = max(m["perf/step_seconds"] - m["perf/rollout_seconds"], 1e-9)
        where = _device_name(cfg["device"]) or platform.processor() or "this machine"
        out[model] = {
            "source": f"measured on {where} ({steps} MoE-SFT-GRPO steps, random weights)",
            "generate": generated / m["perf/rollout_seconds"],
            "train": trained / training_seconds,
            "notes": [
                f"mean completion {m['completion/length_mean']:.0f} tokens, prompt {m['prompt/length_mean']:.0f}"
            ],
        }
    return out


def _device_name(device: str) -> str | None:
    if device != "cuda":
        return None
    import torch

    return str(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else None
