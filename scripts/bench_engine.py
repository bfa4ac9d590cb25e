"""Rollout tokens per second: transformers' generate (HFEngine) against the CPU sampling engine
(KVEngine, training/kv_decode.py), side by side in one process on the same prompts.

    .venv/bin/python scripts/bench_engine.py --model results/toy-study/sft/qwen2/gsm8k/e0-e1-e2/seed0/model \
        --data results/toy-study/toy/data/gsm8k

Each round samples one RL batch as the study does (8 questions x 3 expert prompts, 3/3/2
rollouts, temperature 0.7, up to 192 tokens), first with one engine, then the other, from the
same seed; the median tokens per second of each engine is kept. Then greedy output of both engines
on 48 further questions is compared token for token. `--parts` then times two pieces of one
decoding step alone at a full batch (64 rows, 200 cached columns), each against what bounds it:
the model's widest linear layer against the thread's matrix rate, and one layer's attention over
the cache (kv_decode.decode_attention) against the bytes of keys and values it reads.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from meml.core.attention import attention_kwargs
    from meml.core.records import read_records
    from meml.data.experts import DEFAULT_PROMPTS
    from meml.training.kv_decode import KVEngine
    from meml.training.rollout import HFEngine, Sampling, prompt_ids

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a model folder (the study's MEF model)")
    parser.add_argument("--data", required=True, help="a prepared data folder with train.jsonl")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=192)
    parser.add_argument("--parts", action="store_true", help="also time a linear layer and one layer's attention")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, **attention_kwargs("cpu"))
    records = read_records(Path(args.data) / "train.jsonl")

    def chat(question: str, expert: int) -> list[int]:
        messages = [{"role": "system", "content": DEFAULT_PROMPTS[expert]}, {"role": "user", "content": question}]
        return prompt_ids(tokenizer, messages)

    sampling = Sampling(max_new_tokens=args.tokens, temperature=0.7)
    rates: dict[str, list[float]] = {"hf": [], "kv": []}
    for round_ in range(args.rounds):
        prompts = [chat(r.question, e) for r in records[8 * round_ : 8 * round_ + 8] for e in range(3)]
        for name, engine in (("hf", HFEngine(model, tokenizer)), ("kv", KVEngine(model, tokenizer))):
            torch.manual_seed(round_)
            started = time.perf_counter()
            out = engine.generate(prompts, [3, 3, 2] * 8, sampling)
            seconds = time.perf_counter() - started
            tokens = sum(len(c.token_ids) for group in out for c in group)
            rates[name].append(tokens / seconds)
            print(f"round {round_} {name}: {tokens} tokens in {seconds:.2f} s = {tokens / seconds:.0f} tokens/s")
    hf, kv = statistics.median(rates["hf"]), statistics.median(rates["kv"])
    print(f"median tokens/s: hf {hf:.0f}, kv {kv:.0f}; kv/hf {kv / hf:.2f}x")
    greedy = Sampling(max_new_tokens=args.tokens, greedy=True)
    prompts = [chat(r.question, i % 3) for i, r in enumerate(records[100:148])]
    want = HFEngine(model, tokenizer).generate(prompts, 1, greedy)
    got = KVEngine(model, tokenizer).generate(prompts, 1, greedy)
    same = sum(w[0].token_ids == g[0].token_ids for w, g in zip(want, got, strict=True))
    print(f"greedy output identical on {same} of {len(prompts)} prompts")
    if args.parts:
        decode_parts(model)


def decode_parts(model: Any) -> None:
    import torch
    import torch.nn.functional as F
    from timing import best_time, matrix_rate

    from meml.training.kv_decode import decode_attention

    config = model.config
    rows, columns = 64, 200
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    weight = model.model.layers[0].mlp.gate_proj.weight.detach()
    gate_up = torch.cat([weight, weight])  # the engine's fused gate/up projection
    x = torch.randn(rows, config.hidden_size)
    linear = best_time(lambda: F.linear(x, gate_up))
    flops = 2 * rows * gate_up.shape[0] * gate_up.shape[1]
    rate = matrix_rate()
    print(f"linear {rows} x {gate_up.shape[1]} by {gate_up.shape[1]} x {gate_up.shape[0]}: {linear * 1e6:.0f} us, "
          f"{flops / linear / 1e9:.1f} GFLOP/s (a 1024 x 1024 product: {rate / 1e9:.1f} GFLOP/s)")  # fmt: skip
    q = torch.randn(rows, heads, 1, head_dim)
    keys, values = torch.randn(rows, kv_heads, columns, head_dim), torch.randn(rows, kv_heads, columns, head_dim)
    bias = torch.zeros(rows, 1, 1, columns)
    attention = best_time(lambda: decode_attention(q, keys, values, bias, head_dim**-0.5))
    read = 2 * keys.numel() * keys.element_size()
    print(f"attention of {rows} rows over {columns} cached columns (one layer): {attention * 1e6:.0f} us, "
          f"reads {read / 1e6:.1f} MB of keys and values: {read / attention / 1e9:.1f} GB/s")  # fmt: skip


if __name__ == "__main__":
    main()
