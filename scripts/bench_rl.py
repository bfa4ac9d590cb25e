"""Benchmark of the RL step, measured side by side in one run (ratios, not absolute times).

    .venv/bin/python scripts/bench_rl.py --model results/toy/sft/qwen2/gsm8k/e0-e1-e2/model \
        --data results/toy/toy/data/gsm8k --experts results/toy/toy/experts/gsm8k

Four runs on the same model, data, G = 8, eight questions a step and the same completion limit:
    grpo   our loop, Expert1-SFT-GRPO switches (one expert, 8 rollouts)
    moe    our loop, MoE-SFT-GRPO switches (three experts 3/3/2; the same rollouts as MEML)
    meml   our loop, MEML-GRPO switches (three experts 3/3/2, IML and HSFT on)
    trl    trl's GRPOTrainer (expert 1's prompt, 8 generations, beta 0)
MEML/MoE isolates the cost of IML and HSFT (same prompts, same rollouts); MEML/GRPO is the
issue's ratio at the same total number of rollouts, but its experts write shorter completions.
Each runs in its own process (so peak memory is its own); the order is repeated `--rounds` times
and the median step time is kept. The first step of each run is a warm-up and is not counted.
Prints the step-time ratios and the peak resident memory of each.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def measure(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    from meml.core.config import load_config

    cfg = load_config()
    steps = args.steps + 1
    if kind in ("grpo", "moe", "meml"):
        from meml.training.rl import Method, run_rl

        name = {"grpo": "Expert1-SFT-GRPO", "moe": "MoE-SFT-GRPO", "meml": "MEML-GRPO"}[kind]
        settings = dict(
            cfg["rl"],
            steps=steps,
            questions_per_step=8,
            group_size=8,
            max_new_tokens=args.tokens,
            max_truncated_share=1.0,  # a throughput benchmark: short caps are its choice
            checkpoint_every=10_000,
        )
        settings["buffer"] = dict(settings["buffer"], capacity=args.buffer)
        with tempfile.TemporaryDirectory() as out:
            run_rl(
                settings,
                Method.from_config(name, cfg["methods"][name]),
                args.model,
                args.data,
                args.experts,
                out,
                progress=False,
            )
            rows = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]
        times = [r["perf/step_seconds"] for r in rows[1:]]
        extra = {
            "iml_pairs_per_step": statistics.mean(r["iml/pairs"] for r in rows),
            "hsft_flushes": rows[-1]["hsft/flushes"],
            "completion_tokens_mean": statistics.mean(r["completion/length_mean"] for r in rows),
        }
    else:
        times, extra = _measure_trl(args, steps)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"kind": kind, "step_seconds": times, "peak_rss_mb": round(peak_mb, 1), **extra}


def _measure_trl(args: argparse.Namespace, steps: int) -> tuple[list[float], dict[str, Any]]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from meml.core.answers import is_correct
    from meml.core.config import load_config
    from meml.core.records import read_records
    from meml.data.experts import chat_messages

    records = read_records(Path(args.data) / "train.jsonl")
    rows = [{"prompt": chat_messages(r, 1), "answer": r.answer} for r in records]

    def reward(prompts: list[Any], completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        return [float(is_correct(c[0]["content"], "gsm8k", a)) for c, a in zip(completions, answer, strict=True)]

    times: list[float] = []

    class Timer(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.t = time.time()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            times.append(time.time() - self.t)

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=64,
            num_generations=8,
            steps_per_generation=1,
            max_completion_length=args.tokens,
            max_steps=steps,
            learning_rate=2e-4,
            beta=0.0,
            use_cpu=True,
            bf16=False,
            gradient_checkpointing=False,
            report_to="none",
            logging_steps=1,
            save_strategy="no",
            temperature=float(load_config()["rl"]["temperature"]),  # the same sampling as our loop
            top_p=1.0,
            loss_type="grpo",
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(args.model),
            reward_funcs=[reward],
            args=config,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            callbacks=[Timer()],
        )
        trainer.train()
    return times[1:], {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="an SFT'd model folder (MEF on E0+E1+E2)")
    parser.add_argument("--data", required=True, help="prepared data folder (train.jsonl)")
    parser.add_argument("--experts", required=True, help="expert trajectories folder")
    parser.add_argument("--steps", type=int, default=3, help="measured steps per run (after one warm-up)")
    parser.add_argument("--tokens", type=int, default=128, help="max completion tokens")
    parser.add_argument("--buffer", type=int, default=16, help="HSFT buffer capacity (small so that it flushes)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", choices=["grpo", "moe", "meml", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help="also write the results as JSON here")
    args = parser.parse_args()
    if args.only:
        print("RESULT " + json.dumps(measure(args.only, args)))
        return
    results: dict[str, list[dict[str, Any]]] = {"grpo": [], "moe": [], "meml": [], "trl": []}
    for _ in range(args.rounds):
        for kind in results:
            cmd = [sys.executable, __file__, *sys.argv[1:], "--only", kind]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
            results[kind].append(json.loads(line[len("RESULT ") :]))
    median = {k: statistics.median(t for r in v for t in r["step_seconds"]) for k, v in results.items()}
    peak = {k: max(r["peak_rss_mb"] for r in v) for k, v in results.items()}
    summary = {
        "median_step_seconds": {k: round(v, 3) for k, v in median.items()},
        "meml_over_grpo": round(median["meml"] / median["grpo"], 3),
        "meml_over_moe": round(median["meml"] / median["moe"], 3),
        "ours_over_trl": round(median["grpo"] / median["trl"], 3),
        "peak_rss_mb": peak,
        "meml_iml_pairs_per_step": results["meml"][0]["iml_pairs_per_step"],
        "meml_hsft_flushes": results["meml"][0]["hsft_flushes"],
        "completion_tokens_mean": {k: results[k][0].get("completion_tokens_mean") for k in ("grpo", "moe", "meml")},
        "settings": {
            "questions_per_step": 8,
            "group_size": 8,
            "max_new_tokens": args.tokens,
            "steps": args.steps,
            "rounds": args.rounds,
        },
    }
    print(json.dumps(summary, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
