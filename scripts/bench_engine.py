"""Rollout tokens per second: transformers' generate (HFEngine) against the CPU sampling engine
(KVEngine, training/kv_decode.py), side by side in one process on the same prompts.

    .venv/bin/python scripts/bench_engine.py --model results/toy-study-gsm8k/sft/qwen2/gsm8k/e0-e1-e2/seed0/model \
        --data results/toy-study-gsm8k/toy/data/gsm8k

Each round samples one RL batch as the study does (8 questions x 3 expert prompts, 3/3/2
rollouts, temperature 0.7, up to 192 tokens), first with one engine, then the other, from the
same seed; the median tokens per second of each engine is kept. Then greedy output of both engines
on 48 further questions is compared token for token.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path


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


if __name__ == "__main__":
    main()
