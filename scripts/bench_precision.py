"""bf16 against fp32 on this CPU, side by side in one process on one thread: the speed of an SFT
step, an RL scoring step and sampling (the kv engine and vLLM), and how far the numbers move
(greedy agreement, accuracy on a data set's test questions).

    python scripts/bench_precision.py --model DIR --data DIR [--questions 100] [--out FILE.json]

DIR is a model folder (for SmolLM2: the folder config/real-model.yaml's run writes under
results/real-model/models/, or gguf_models.convert's output) and a data folder holding
<dataset>/test.jsonl. Prints a Markdown table; --out writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import best_time

from meml.core.environment import cpu_model
from meml.core.precision import Precision, cpu_has_bf16
from meml.core.records import read_records
from meml.data.experts import chat_messages
from meml.training.rollout import Sampling, prompt_ids

FP32 = Precision("cpu", "float32", False)
BF16 = Precision("cpu", "bfloat16", False)


def matmul_rates() -> dict[str, float]:
    import torch

    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(1024, 1024, dtype=dtype), torch.randn(1024, 1024, dtype=dtype)
        seconds = best_time(lambda a=a, b=b: a @ b, 10, 3)
        out[str(dtype).removeprefix("torch.")] = round(2 * 1024**3 / seconds / 1e9, 1)
    return out


def train_step_seconds(model: Any, precision: Precision, batch: int, length: int) -> tuple[float, float]:
    """One forward and backward pass on batch x length tokens (an SFT step's arithmetic): seconds, loss."""
    import torch

    ids = torch.randint(0, model.config.vocab_size, (batch, length), generator=torch.Generator().manual_seed(0))

    def step() -> float:
        with precision.autocast():
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        return float(loss)

    loss = step()
    return best_time(step, calls=1, warmup=1), loss


def rl_step_seconds(model: Any, tokenizer: Any, prompts: list[list[int]], precision: Precision) -> float:
    """The RL update's scoring pass, forward and backward, on G = 8 rollouts of 64 tokens a prompt."""
    import torch

    from meml.training.scoring import completion_logprobs

    draw = torch.Generator().manual_seed(1)
    rows = [p for p in prompts[:4] for _ in range(8)]
    completions = [torch.randint(0, len(tokenizer), (64,), generator=draw).tolist() for _ in rows]

    def step() -> None:
        with precision.autocast():
            logp, mask, _ = completion_logprobs(model, rows, completions, tokenizer.pad_token_id)
        (-(logp * mask).sum()).backward()
        model.zero_grad(set_to_none=True)

    return best_time(step, calls=1, warmup=1)


def sampled_tokens_per_second(engine: Any, prompts: list[list[int]]) -> float:
    started = time.perf_counter()
    out = engine.generate(prompts, 4, Sampling(64, 0.7, 1.0))
    return sum(len(c.token_ids) for g in out for c in g) / (time.perf_counter() - started)


def accuracy(engine: Any, prompts: list[list[int]], records: list[Any], dataset: str) -> list[bool]:
    from meml.core.answers import answers_match, extract

    out = engine.generate(prompts, 1, Sampling(128, greedy=True))
    return [
        answers_match(extract(g[0].text, dataset, "lenient", r.options), r.answer, dataset)
        for g, r in zip(out, records, strict=True)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True, help="a folder with <dataset>/test.jsonl")
    parser.add_argument("--dataset", default="strategyqa")
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from meml.training.kv_decode import KVEngine
    from meml.training.rollout_vllm import VLLMEngine, VLLMSettings

    if not cpu_has_bf16():
        print("this CPU has no bf16 arithmetic (AVX512-BF16 or AMX): nothing to compare", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    records = read_records(Path(args.data) / args.dataset / "test.jsonl", args.dataset)[: args.questions]
    prompts = [prompt_ids(tokenizer, chat_messages(r, 0)) for r in records]
    report: dict[str, Any] = {"cpu": cpu_model(), "threads": 1,
                              "model": str(args.model), "matmul_gflops_1024": matmul_rates()}  # fmt: skip
    for name, precision in (("fp32", FP32), ("bf16", BF16)):
        seconds, loss = train_step_seconds(model, precision, 4, 200)
        report[f"sft_step_seconds_{name}"] = round(seconds, 3)
        report[f"sft_loss_{name}"] = round(loss, 4)
        report[f"rl_scoring_step_seconds_{name}"] = round(rl_step_seconds(model, tokenizer, prompts, precision), 3)
    model.eval()
    kv = {name: KVEngine(model, tokenizer, 64, precision) for name, precision in (("fp32", FP32), ("bf16", BF16))}
    settings = VLLMSettings.from_config({"gpu_memory_utilization": 0.3, "max_model_len": None, "cpu_kv_cache_gib": 1,
                                         "enforce_eager": None})  # fmt: skip
    vllm = {name: VLLMEngine(args.model, tokenizer, p, settings, 0) for name, p in (("fp32", FP32), ("bf16", BF16))}
    greedy = Sampling(64, greedy=True)
    tokens = {}
    for engine_name, engines in (("kv", kv), ("vllm", vllm)):
        torch.manual_seed(0)
        for name, engine in engines.items():
            report[f"{engine_name}_sampled_tokens_per_second_{name}"] = round(
                sampled_tokens_per_second(engine, prompts[:8]), 1
            )
            tokens[engine_name, name] = [g[0].token_ids for g in engine.generate(prompts, 1, greedy)]
            correct = accuracy(engine, prompts, records, args.dataset)
            report[f"{engine_name}_accuracy_{name}"] = round(100 * sum(correct) / len(correct), 1)
            report[f"{engine_name}_correct_{name}"] = correct
    n = len(prompts)
    report["questions"] = n
    for a, b in ((("kv", "fp32"), ("vllm", "fp32")), (("kv", "bf16"), ("vllm", "bf16")),
                 (("kv", "fp32"), ("kv", "bf16")), (("vllm", "fp32"), ("vllm", "bf16"))):  # fmt: skip
        same = sum(x == y for x, y in zip(tokens[a], tokens[b], strict=True))
        report[f"greedy_identical_{a[0]}_{a[1]}_vs_{b[0]}_{b[1]}"] = f"{same}/{n}"
    for engine_name in ("kv", "vllm"):  # the paired difference of accuracy, bf16 - fp32, over the questions
        x, y = report.pop(f"{engine_name}_correct_bf16"), report.pop(f"{engine_name}_correct_fp32")
        d = [float(p) - float(q) for p, q in zip(x, y, strict=True)]
        mean = sum(d) / n
        sd = (sum((v - mean) ** 2 for v in d) / max(n - 1, 1)) ** 0.5
        half = 1.96 * sd / n**0.5
        low, high = 100 * (mean - half), 100 * (mean + half)
        report[f"{engine_name}_accuracy_bf16_minus_fp32"] = f"{100 * mean:+.1f} [{low:+.1f}, {high:+.1f}]"
    print("| figure | value |\n| --- | --- |")
    for key, value in report.items():
        print(f"| {key} | {value} |")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
