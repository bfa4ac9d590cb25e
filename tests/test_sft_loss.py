"""MEF's loss on a CPU (`sft.labelled_token_loss`) against trl's fused LM head: the same loss and
the same gradient to float32 rounding, for templates with assistant marks (the toy tokenizers)
and without (SmolLM2's, where trl takes prompt / completion rows), on both tiny architectures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from meml.data.tiny_models import build_model, train_tokenizer
from meml.training.sft import _sft_trainer_class, training_rows

CORPUS = ["Think step by step. 5 + 7 = 12. The answer is 12.\n#### 12", "So the answer is yes.", "answer : c"] * 20


def _conversation(i: int) -> dict[str, Any]:
    answer = " ".join(["5 + 7 = 12."] * (1 + i % 4)) + f" The answer is {i}."  # unequal lengths: padding
    return {
        "messages": [
            {"role": "system", "content": f"You are expert {i % 3}."},
            {"role": "user", "content": f"What is {i} + 7?"},
            {"role": "assistant", "content": answer},
        ]
    }


@pytest.mark.parametrize(("style", "kind"), [("toy", "qwen2"), ("toy", "llama"), ("smollm2-instruct", "llama")])
def test_cpu_loss_and_gradient_equal_trls_fused_head(style: str, kind: str, tmp_path: Path) -> None:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    tokenizer = train_tokenizer(CORPUS, 300, style)
    rows, marked = training_rows(tokenizer, [_conversation(i) for i in range(6)])
    config = SFTConfig(
        output_dir=str(tmp_path), assistant_only_loss=marked, completion_only_loss=not marked, max_length=256,
        report_to="none", use_cpu=True, per_device_train_batch_size=6,
    )  # fmt: skip
    results = []
    for trainer_class in (SFTTrainer, _sft_trainer_class("cpu")):
        model = build_model(kind, tokenizer, 0)
        trainer = trainer_class(
            model=model, args=config, train_dataset=Dataset.from_list(rows), processing_class=tokenizer
        )
        batch = trainer.data_collator([trainer.train_dataset[i] for i in range(6)])
        assert (batch["labels"] == -100).any() and (batch["labels"] != -100).any()
        assert (batch["attention_mask"] == 0).any()  # padding is present and must not count
        for count in (None, torch.tensor(37)):  # per batch, and over an accumulation the Trainer counted
            model.zero_grad()
            loss = trainer.compute_loss(model, dict(batch), num_items_in_batch=count)
            loss.backward()
            grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
            results.append((loss.detach(), grads, trainer._metrics["train"]["mean_token_accuracy"][-1]))
    trl_results, ours = results[:2], results[2:]
    for (trl_loss, trl_grad, trl_acc), (loss, grad, acc) in zip(trl_results, ours, strict=True):
        assert loss > 0
        torch.testing.assert_close(loss, trl_loss, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grad, trl_grad, rtol=1e-4, atol=1e-6)
        assert acc == pytest.approx(trl_acc)
    # the count divides: 37 tokens of an accumulation against this batch's own labelled tokens
    labelled = int((batch["labels"][:, 1:] != -100).sum())
    assert float(ours[1][0]) == pytest.approx(float(ours[0][0]) * labelled / 37, rel=1e-5)


def test_the_gpu_keeps_trls_trainer() -> None:
    from trl import SFTTrainer

    assert _sft_trainer_class("cuda") is SFTTrainer and _sft_trainer_class("cpu") is not SFTTrainer


@pytest.mark.parametrize(
    ("batch", "accum", "processes", "expected"),
    [
        (8, 4, 1, (8, 4)),
        (8, 4, 2, (8, 2)),
        (8, 4, 4, (8, 1)),
        (16, 1, 1, (16, 1)),
        (16, 1, 2, (8, 1)),
        (6, 2, 4, (3, 1)),
    ],
)
def test_the_effective_sft_batch_is_the_configs_whatever_the_processes(
    batch: int, accum: int, processes: int, expected: tuple[int, int]
) -> None:
    """batch_size x grad_accum sequences an optimiser step on one process or several: accumulation
    shrinks first, then the per-process batch; a share the processes cannot split evenly is refused."""
    from meml.core.io import DataError
    from meml.training.sft import per_process_batch

    settings = {"batch_size": batch, "grad_accum": accum}
    per_device, steps = per_process_batch(settings, processes)
    assert (per_device, steps) == expected and per_device <= batch
    assert per_device * steps * processes == batch * accum
    with pytest.raises(DataError, match=r"sft\.grad_accum"):
        per_process_batch({"batch_size": 8, "grad_accum": 4}, 3)  # 32 cannot be shared by three processes
