"""Benchmark of the RL step, measured side by side in one run (ratios, not absolute times).

    .venv/bin/python scripts/bench_rl.py --model results/toy-study/sft/qwen2/gsm8k/e0-e1-e2/seed0/model \
        --data results/toy-study/toy/data/gsm8k --experts results/toy-study/toy/experts/gsm8k \
        [--against /path/to/an/older/checkout]

Runs on the same model, data, G = 8, eight questions a step and the same completion limit:
    grpo   our loop, Expert1-SFT-GRPO switches (one expert, 8 rollouts)
    moe    our loop, MoE-SFT-GRPO switches (three experts 3/3/2; the same rollouts as MEML)
    meml   our loop, MEML-GRPO switches (three experts 3/3/2, IML and HSFT on)
    trl    trl's GRPOTrainer (expert 1's prompt, 8 generations, beta 0)
    then   with --against: grpo and meml again, on another checkout's code, driven through its
           CLI (`meml rl --sft-dir ... --out ... --set ...`, which has stayed put since before the
           loop took typed settings), with its own default config and these settings laid over it:
           for example commit a588599 in a git worktree (tests/test_bench_rl.py runs it there)
MEML/MoE isolates the cost of IML and HSFT (same prompts, same rollouts); MEML/GRPO is the
issue's ratio at the same total number of rollouts, but its experts write shorter completions.
Each runs in its own process (so peak memory is its own) on `--threads` threads (1: what a DAG
job gets); the order is repeated `--rounds` times and the median step time is kept. The first step
of each run is a warm-up and is not counted. Prints the step-time ratios and the peak resident
memory of each.

The roofline: one more MEML-GRPO step runs under torch's FlopCounterMode, which counts the FLOPs of
every matrix product (rollouts, scoring, IML, HSFT, backward; attention through SDPA on a CPU is
not counted, a few percent at this size); divided by the median MEML step time, that is the rate
the step reaches, beside this machine's matrix throughput measured in the same process (a 1024 x
1024 float32 product on the same threads): how far the step is from the arithmetic limit.
"""

from __future__ import annotations

import argparse
import json
import os
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

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from meml.core.config import load_config

    cfg = load_config()
    steps = args.steps + 1
    if kind in ("grpo", "moe", "meml"):
        from meml.training.rl import Method, RLArgs, RLPaths, RLSettings, run_rl

        name = METHODS[kind]
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
                RLArgs(RLSettings.from_config(settings), Method.from_config(name, cfg["methods"][name])),
                RLPaths(args.model, args.data, args.experts, out),
                progress=False,
            )
            rows = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]
        times = [r["perf/step_seconds"] for r in rows[1:]]
        extra = {
            "iml_pairs_per_step": statistics.mean(r["iml/pairs"] for r in rows),
            "hsft_flushes": rows[-1]["hsft/flushes"],
            "completion_tokens_mean": statistics.mean(r["completion/length_mean"] for r in rows),
        }
    elif kind == "flops":
        return _measure_flops(args)
    else:
        times, extra = _measure_trl(args, steps)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"kind": kind, "step_seconds": times, "peak_rss_mb": round(peak_mb, 1), **extra}


def _measure_flops(args: argparse.Namespace) -> dict[str, Any]:
    """FLOPs of one MEML-GRPO step (FlopCounterMode) and the machine's matrix throughput."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from meml.core.config import load_config
    from meml.training.rl import Method, RLArgs, RLPaths, RLSettings, run_rl

    cfg = load_config()
    settings = dict(cfg["rl"], steps=1, questions_per_step=8, group_size=8, max_new_tokens=args.tokens,
                    max_truncated_share=1.0, checkpoint_every=10_000)  # fmt: skip
    settings["buffer"] = dict(settings["buffer"], capacity=args.buffer)
    counter = FlopCounterMode(display=False)
    with tempfile.TemporaryDirectory() as out, counter:
        meml = Method.from_config("MEML-GRPO", cfg["methods"]["MEML-GRPO"])
        run_rl(RLArgs(RLSettings.from_config(settings), meml), RLPaths(args.model, args.data, args.experts, out),
               progress=False)  # fmt: skip
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    for _ in range(3):  # warm-up
        a @ b
    rounds, started = 20, time.perf_counter()
    for _ in range(rounds):
        a @ b
    matmul = 2 * 1024**3 * rounds / (time.perf_counter() - started)
    return {"kind": "flops", "step_flops": counter.get_total_flops(), "matmul_flops_per_second": matmul}


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


METHODS = {"grpo": "Expert1-SFT-GRPO", "moe": "MoE-SFT-GRPO", "meml": "MEML-GRPO"}


def measure_checkout(checkout: str | Path, kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """`kind` (grpo, meml) on another checkout's code, through its CLI: a results folder whose toy
    data and trajectories are links to --data and --experts, the SFT model given as --sft-dir, and
    the benchmark's settings as --set overrides of its own default config (keys every checkout since
    the loop's first release has). Returns what `measure` returns, from the run's metrics.jsonl."""
    overrides = {
        "rl.steps": args.steps + 1,
        "rl.questions_per_step": 8,
        "rl.group_size": 8,
        "rl.max_new_tokens": args.tokens,
        "rl_by_dataset.gsm8k.max_new_tokens": args.tokens,
        "rl.max_truncated_share": 1.0,
        "rl.checkpoint_every": 10_000,
        "rl.buffer.capacity": args.buffer,
        "mlflow.enabled": False,
    }
    with tempfile.TemporaryDirectory() as work:
        results = Path(work) / "results"
        for part, source in (("data", args.data), ("experts", args.experts)):
            (results / "toy" / part).mkdir(parents=True)
            (results / "toy" / part / "gsm8k").symlink_to(Path(source).resolve())
        cmd = [sys.executable, "-m", "meml.cli", "rl", "--model", "qwen2", "--dataset", "gsm8k",
               "--method", METHODS[kind], "--seed", "0", "--sft-dir", str(Path(args.model).resolve()),
               "--results", str(results), "--out", str(Path(work) / "run")]  # fmt: skip
        for key, value in overrides.items():
            cmd += ["--set", f"{key}={json.dumps(value)}"]
        threads = str(args.threads)
        env = {**os.environ, "PYTHONPATH": str(Path(checkout).resolve() / "pipeline"), "OMP_NUM_THREADS": threads,
               "MKL_NUM_THREADS": threads, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}  # fmt: skip
        env.pop("MEML_WORKER", None)
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work)
        if done.returncode != 0:
            raise SystemExit(f"bench_rl: {kind} on {checkout} failed:\n{done.stderr[-3000:]}")
        rows = [json.loads(x) for x in (Path(work) / "run" / "metrics.jsonl").read_text().splitlines()]
    return {
        "kind": f"then-{kind}",
        "step_seconds": [r["perf/step_seconds"] for r in rows[1:]],
        "peak_rss_mb": None,  # the CLI's process, not measured from here
        "iml_pairs_per_step": statistics.mean(r["iml/pairs"] for r in rows),
        "hsft_flushes": rows[-1]["hsft/flushes"],
        "completion_tokens_mean": statistics.mean(r["completion/length_mean"] for r in rows),
        "metric_names": sorted(rows[0]),  # what that checkout's loop logs (its own code ran, not this one)
    }


def _run(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """One measurement in a fresh process (`then-*`: on the --against checkout's code, its CLI)."""
    if kind.startswith("then-"):
        return measure_checkout(args.against, kind.removeprefix("then-"), args)
    env = dict(os.environ)
    cmd = [sys.executable, __file__, *sys.argv[1:], "--only", kind]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"bench_rl: the {kind} run failed:\n{done.stderr[-3000:]}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return dict(json.loads(line[len("RESULT ") :]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="an SFT'd model folder (MEF on E0+E1+E2)")
    parser.add_argument("--data", required=True, help="prepared data folder (train.jsonl)")
    parser.add_argument("--experts", required=True, help="expert trajectories folder")
    parser.add_argument("--steps", type=int, default=3, help="measured steps per run (after one warm-up)")
    parser.add_argument("--tokens", type=int, default=128, help="max completion tokens")
    parser.add_argument("--buffer", type=int, default=16, help="HSFT buffer capacity (small so that it flushes)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run (a DAG job has 1)")
    parser.add_argument("--against", help="another checkout whose grpo and meml run too, through its CLI")
    parser.add_argument("--only", choices=["grpo", "moe", "meml", "trl", "flops"],
                        help=argparse.SUPPRESS)  # fmt: skip
    parser.add_argument("--out", default=None, help="also write the results as JSON here")
    args = parser.parse_args()
    if args.only:
        print("RESULT " + json.dumps(measure(args.only, args)))
        return
    kinds = ["grpo", "moe", "meml", "trl"] + (["then-grpo", "then-meml"] if args.against else [])
    results: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    for _ in range(args.rounds):
        for kind in kinds:
            results[kind].append(_run(kind, args))
    flops = _run("flops", args)
    median = {k: statistics.median(t for r in v for t in r["step_seconds"]) for k, v in results.items()}
    peak = {k: max(r["peak_rss_mb"] for r in v) for k, v in results.items() if v[0]["peak_rss_mb"] is not None}
    reached = flops["step_flops"] / median["meml"]
    summary: dict[str, Any] = {
        "median_step_seconds": {k: round(v, 3) for k, v in median.items()},
        "meml_over_grpo": round(median["meml"] / median["grpo"], 3),
        "meml_over_moe": round(median["meml"] / median["moe"], 3),
        "trl_over_ours": round(median["trl"] / median["grpo"], 3),
        "peak_rss_mb": peak,
        "meml_iml_pairs_per_step": results["meml"][0]["iml_pairs_per_step"],
        "meml_hsft_flushes": results["meml"][0]["hsft_flushes"],
        "completion_tokens_mean": {k: r[0].get("completion_tokens_mean") for k, r in results.items() if k != "trl"},
        "roofline": {
            "meml_step_gflop": round(flops["step_flops"] / 1e9, 3),
            "reached_gflop_per_second": round(reached / 1e9, 2),
            "machine_matmul_gflop_per_second": round(flops["matmul_flops_per_second"] / 1e9, 2),
            "share_of_matmul_throughput": round(reached / flops["matmul_flops_per_second"], 4),
        },
        "settings": {
            "questions_per_step": 8,
            "group_size": 8,
            "max_new_tokens": args.tokens,
            "steps": args.steps,
            "rounds": args.rounds,
            "threads": args.threads,
        },
    }
    if args.against:
        summary["against"] = args.against
        summary["then_over_now"] = {
            "grpo": round(median["then-grpo"] / median["grpo"], 3),
            "meml": round(median["then-meml"] / median["meml"], 3),
        }
    print(json.dumps(summary, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
