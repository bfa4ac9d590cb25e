"""Where a MEF step's time goes, against this thread's matrix rate (docs/training.md, "Where the limit is").

    .venv/bin/python scripts/profile_sft.py --base results/toy-study/models/seed0/qwen2 \
        --data results/toy-study/toy/data/gsm8k --experts results/toy-study/toy/experts/gsm8k

Takes trl's first `--batches` MEF batches (experts 0, 1, 2; the study's batch size and sampler),
runs them through the CPU loss (`sft.labelled_token_loss`) and AdamW on one thread, and prints:
the step time; the FLOPs of its matrix products counted from the model's shapes (decoder forward
and backward on every position, LM head on the labelled ones); the time torch.profiler puts in
`mm`/`addmm` and in SDPA's kernels; the matrix rate that implies beside a 1024 x 1024 float32
product's on the same thread; and the step time with SDPA's math backend instead of its default.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from typing import Any

from timing import matrix_rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the model MEF starts from")
    parser.add_argument("--data", required=True)
    parser.add_argument("--experts", required=True)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()

    import torch
    from datasets import Dataset
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig

    from meml.training import sft

    torch.set_num_threads(1)
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(args.base)
    model = AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.float32)
    rows, marked = sft.training_rows(tokenizer, sft.sft_examples(args.data, args.experts, [0, 1, 2]))
    config = SFTConfig(
        output_dir="/tmp/profile_sft", per_device_train_batch_size=args.batch_size, max_length=640,
        assistant_only_loss=marked, completion_only_loss=not marked, packing=False,
        train_sampling_strategy="group_by_length", report_to="none", use_cpu=True, bf16=False, save_strategy="no",
    )  # fmt: skip
    trainer = sft._sft_trainer_class("cpu")(
        model=model, args=config, train_dataset=Dataset.from_list(rows), processing_class=tokenizer
    )
    batches: list[Any] = []
    for batch in trainer.get_train_dataloader():
        batches.append(batch)
        if len(batches) == args.batches:
            break
    positions = sum(b["input_ids"].numel() for b in batches) / len(batches)
    labelled = sum(int((b["labels"] != -100).sum()) for b in batches) / len(batches)
    padding = 1 - sum(int(b["attention_mask"].sum()) for b in batches) / len(batches) / positions

    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    attention = cfg.hidden_size * head_dim * (2 * cfg.num_attention_heads + 2 * cfg.num_key_value_heads)
    weights = cfg.num_hidden_layers * (attention + 3 * cfg.hidden_size * cfg.intermediate_size)
    flops = 3 * 2 * (weights * positions + cfg.hidden_size * cfg.vocab_size * labelled)  # forward + backward

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(batch: Any) -> None:
        loss, _ = sft.labelled_token_loss(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    def timed(context: Any) -> float:
        with context():
            for batch in batches[:3]:
                step(batch)
            start = time.perf_counter()
            for batch in batches:
                step(batch)
        return (time.perf_counter() - start) / len(batches)

    default = min(timed(contextlib.nullcontext) for _ in range(2))
    math_backend = min(timed(lambda: sdpa_kernel(SDPBackend.MATH)) for _ in range(2))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for batch in batches:
            step(batch)
    self_ms = {e.key: e.self_cpu_time_total / 1000 / len(batches) for e in prof.key_averages()}
    matmul_ms = self_ms.get("aten::mm", 0.0) + self_ms.get("aten::addmm", 0.0)
    attention_ms = sum(ms for key, ms in self_ms.items() if "scaled_dot_product" in key)
    rate = matrix_rate() / 1e9
    print(f"batch: {positions:.0f} positions ({padding:.1%} padding), {labelled:.0f} labelled tokens")
    print(f"step: {default * 1000:.0f} ms (SDPA math backend: {math_backend * 1000:.0f} ms)")
    print(f"matrix products: {flops / 1e9:.1f} GFLOP a step, {matmul_ms:.0f} ms in mm/addmm (profiled): "
          f"{flops / matmul_ms / 1e6:.1f} GFLOP/s against {rate:.1f} GFLOP/s on a 1024 x 1024 product")  # fmt: skip
    print(f"attention (SDPA kernels, forward and backward): {attention_ms:.0f} ms a step")


if __name__ == "__main__":
    main()
