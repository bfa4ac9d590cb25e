"""MEF, multi-expert fine-tuning, with trl's SFTTrainer.

L_MEF = - sum_k sum_{(Q, O) in E_k} log p(O | Q, P_k): every example carries its expert's system
prompt through the chat template, and the loss covers the assistant tokens only: the ones the
template marks with `{% generation %}` (the tiny models' templates), or, for a template without the
marks (real models' templates: SmolLM2's, Qwen2.5's, Llama-3.2's), everything after the prompt
rendered with its generation prompt, the end-of-turn token included (`training_rows`). Train on
any subset of the expert sets: [1] for the Expert1-SFT baselines, [0, 1, 2]
for MoE-SFT and MEML. CPU: fp32, no bf16, no gradient checkpointing; GPU: bf16 (precision.py).
Under `accelerate launch` the Trainer runs data-parallel; the main process writes the model.

A run saves a checkpoint every `sft.checkpoint_every` optimiser steps into `<out>/work` (the newest
one kept), under a record of what defines the run (`work/identity.json`). A rerun of a killed or
preempted run resumes from the newest complete checkpoint when the identity matches, and starts over
when anything that defines the run changed; the resumed model equals the uninterrupted run's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from meml.core.attention import attention_kwargs
from meml.core.config import without_run_keys
from meml.core.environment import environment_record, weights_sha256
from meml.core.io import DataError, atomic_write_json, locked
from meml.core.precision import Precision, resolve
from meml.core.records import read_records
from meml.data.experts import DEFAULT_PROMPTS, chat_messages, read_trajectories


def per_process_batch(settings: dict[str, Any], processes: int) -> tuple[int, int]:
    """(sequences a process takes a micro-step, micro-steps an optimiser step) that keep the
    effective batch the config names, sft.batch_size x sft.grad_accum sequences an optimiser step,
    whatever the number of processes: under `accelerate launch` each of N processes contributes
    effective / N, in as few micro-steps of at most sft.batch_size as divide it. A batch the processes
    cannot share evenly is refused by name."""
    batch, accum = int(settings["batch_size"]), int(settings["grad_accum"])
    effective = batch * accum
    if effective % processes:
        raise DataError(
            f"sft.batch_size {batch} x sft.grad_accum {accum} = {effective} sequences a step cannot be shared by "
            f"{processes} processes; make it a multiple of launch.processes",
            None,
            None,
            "sft.grad_accum",
        )
    share = effective // processes
    steps = -(-share // batch)  # at least this many micro-steps of at most batch_size
    while share % steps:
        steps += 1
    return share // steps, steps


def sft_examples(
    data_dir: str | Path, experts_dir: str | Path, experts: Sequence[int], prompts: Sequence[str] = DEFAULT_PROMPTS
) -> list[dict[str, Any]]:
    """Conversational examples {"messages": [system P_k, user Q, assistant O]} for the chosen experts."""
    records = {r.id: r for r in read_records(Path(data_dir) / "train.jsonl")}
    examples = []
    for k in experts:
        path = Path(experts_dir) / f"e{k}.jsonl"
        for record, expert, completion in read_trajectories(path, records):
            if expert != k:
                raise DataError(f"file of expert {k} holds a trajectory of expert {expert}", path)
            examples.append(
                {"messages": [*chat_messages(record, k, prompts), {"role": "assistant", "content": completion}]}
            )
    if not examples:
        raise DataError(f"no SFT examples for experts {list(experts)}", experts_dir)
    return examples


def has_generation_marks(template: Any) -> bool:
    """Whether a chat template marks the assistant's tokens with {% generation %} (any trim variant)."""
    import re

    if isinstance(template, dict):
        template = template.get("default", "")
    return bool(re.search(r"\{%-?\s*generation\s*-?%\}", str(template or "")))


def training_rows(tokenizer: Any, examples: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
    """The rows trl trains on and whether they use the template's assistant marks.

    With marks: the conversations as they are (trl's assistant_only_loss). Without: the same
    conversations as prompt (system, user) and completion (the assistant turn), so that the loss
    covers the completion, end-of-turn token and all, whatever the template (trl only patches the
    templates it knows, and refuses the others)."""
    if has_generation_marks(tokenizer.chat_template):
        return examples, True
    return [{"prompt": e["messages"][:-1], "completion": e["messages"][-1:]} for e in examples], False


def truncated_share(tokenizer: Any, examples: list[dict[str, Any]], max_length: int) -> float:
    """The share of SFT examples (chat messages) whose rendered conversation is longer than max_length."""
    lengths = [
        len(tokenizer.apply_chat_template(e["messages"], tokenize=True, return_dict=True)["input_ids"])
        for e in examples
    ]
    return sum(n > max_length for n in lengths) / len(lengths) if lengths else 0.0


def device_settings(precision: Precision) -> dict[str, Any]:
    """trl/transformers settings of a precision: fp32 on CPU (bf16 off, no checkpointing); bf16
    mixed precision (fp32 master weights) with gradient checkpointing on GPU by default."""
    return {
        "use_cpu": precision.device == "cpu",
        "bf16": precision.bf16,
        "fp16": False,
        "gradient_checkpointing": precision.gradient_checkpointing,
    }


def labelled_token_loss(model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None) -> tuple[Any, Any]:
    """L_MEF of one batch, scored on the labelled (assistant) positions only: the mean NLL of their
    tokens (over `num_items_in_batch` when the Trainer accumulates gradients), and their logits.

    trl's fused LM head gives the same loss, but off a GPU it scores every position, prompt and
    padding too, and folds each tile of the vocabulary into seven running statistics with torch
    ops: on a CPU that was 40% of a toy MEF step. Here the head runs once, on the labelled rows."""
    import torch

    labels = inputs["labels"]
    backbone_inputs = {k: inputs[k] for k in ("input_ids", "attention_mask", "position_ids") if k in inputs}
    hidden = model.base_model(**backbone_inputs, use_cache=False).last_hidden_state  # [B, T, H]
    targets = labels[:, 1:]  # position t predicts token t + 1
    labelled = targets != -100
    logits = model.get_output_embeddings()(hidden[:, :-1][labelled]).float()  # [N, V], N labelled tokens
    log_probs = torch.log_softmax(logits, dim=-1).gather(1, targets[labelled][:, None]).squeeze(1)
    count = labelled.sum() if num_items_in_batch is None else num_items_in_batch
    return -log_probs.sum() / torch.as_tensor(count).clamp(min=1), logits.detach()


def run_identity(start_sha256: str, rows: list[dict[str, Any]], settings: dict[str, Any], **more: Any) -> str:
    """A hash of what defines an SFT run: the start weights' hash, the rows, the settings (less how
    the run is kept: core/config.RUN_KEYS) and the rest (`more`: seed, precision, processes). A
    checkpoint made under another identity is never resumed."""
    text = json.dumps([start_sha256, rows, without_run_keys("sft", settings), more], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def resumable_checkpoint(work: Path, identity: str) -> Path | None:
    """The newest complete checkpoint in `work` made under `identity`, or None. The Trainer writes a
    checkpoint's trainer_state.json last, so a checkpoint cut short by a kill has none (or an
    unreadable one) and is passed over."""
    try:
        if json.loads((work / "identity.json").read_text())["identity"] != identity:
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    complete = []
    for folder in work.glob("checkpoint-*"):
        try:
            step = int(json.loads((folder / "trainer_state.json").read_text())["global_step"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        complete.append((step, folder))
    return max(complete)[1] if complete else None


def _sft_trainer_class(device: str) -> Any:
    """trl's SFTTrainer; on a CPU with `compute_loss` replaced by `labelled_token_loss` (the same
    loss and the same logged metrics: entropy, token accuracy, tokens seen) in a single process."""
    from trl import SFTTrainer

    if device != "cpu":
        return SFTTrainer

    class LabelledTokenSFTTrainer(SFTTrainer):  # type: ignore[misc]
        def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False, num_items_in_batch: Any = None):
            import torch

            if return_outputs:  # only evaluation loops ask for outputs; MEF runs none
                raise NotImplementedError("the CPU MEF trainer returns the loss only")
            if self.accelerator.num_processes > 1:  # the DDP wrapper's forward syncs the gradients: keep trl's
                return super().compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
            loss, logits = labelled_token_loss(model, inputs, num_items_in_batch)
            mode = "train" if model.training else "eval"
            with torch.no_grad():
                log_p = torch.log_softmax(logits, dim=-1)
                targets = inputs["labels"][:, 1:]
                targets = targets[targets != -100]
                entropy = -(log_p.exp() * log_p).sum(-1)
                self._metrics[mode]["entropy"].append(entropy.mean().item() if len(targets) else 0.0)
                correct = (logits.argmax(-1) == targets).float()
                self._metrics[mode]["mean_token_accuracy"].append(correct.mean().item() if len(targets) else 0.0)
            if mode == "train":
                self._total_train_tokens += int(inputs["attention_mask"].sum())
            self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
            return loss

    return LabelledTokenSFTTrainer


@locked("out_dir")  # one writer per run folder
def run_sft(
    model_dir: str | Path,
    data_dir: str | Path,
    experts_dir: str | Path,
    out_dir: str | Path,
    experts: Sequence[int],
    settings: dict[str, Any],
    prompts: Sequence[str] = DEFAULT_PROMPTS,
    seed: int = 0,
    precision: Precision | None = None,
) -> dict[str, Any]:
    """Fine-tune `model_dir` on the experts' trajectories; the model is saved to `out_dir/model`.

    `settings`: lr, epochs, batch_size, grad_accum, max_length, warmup_ratio, scheduler.
    `out_dir/DONE` (JSON summary) is written last; a folder without it is never trusted.
    """
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig

    out = Path(out_dir)
    if (out / "DONE").is_file():
        return dict(json.loads((out / "DONE").read_text()))
    work = out / "work"
    main_process = int(os.environ.get("RANK", "0")) == 0  # under accelerate launch: one writer
    torch.manual_seed(seed)
    tokenizer: Any = AutoTokenizer.from_pretrained(model_dir)
    if not tokenizer.chat_template:
        raise DataError("model has no chat template; SFT needs one that marks assistant turns", model_dir)
    precision = precision or resolve("cpu")
    # fp32 master weights; bf16 runs train under the Trainer's autocast (precision.py)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **attention_kwargs(precision.device))
    examples = sft_examples(data_dir, experts_dir, experts, prompts)
    truncated = truncated_share(tokenizer, examples, int(settings["max_length"]))
    if truncated > 0.05:  # trl cuts an example at max_length without a word, and it loses its answer line
        print(
            f"SFT: {truncated:.0%} of the examples are longer than sft.max_length = {settings['max_length']} tokens "
            "and are cut before their answer line; raise sft.max_length",
            file=sys.stderr,
        )
    rows, marked = training_rows(tokenizer, examples)
    # the config's effective batch whatever the number of processes (accelerate sets WORLD_SIZE)
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    per_device, micro_steps = per_process_batch(settings, processes)
    start_sha256 = weights_sha256(model_dir)  # hashed once: the identity and the run's record
    identity = run_identity(start_sha256, rows, settings, seed=seed, precision=precision, processes=processes)
    resume = resumable_checkpoint(work, identity)
    if resume is None and main_process:  # another run's checkpoints, or none: start over
        shutil.rmtree(work, ignore_errors=True)
        atomic_write_json(work / "identity.json", {"identity": identity})
    every = int(settings.get("checkpoint_every") or 0)
    config = SFTConfig(
        output_dir=str(work),
        learning_rate=float(settings["lr"]),
        num_train_epochs=float(settings["epochs"]),
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=micro_steps,
        lr_scheduler_type=str(settings["scheduler"]),
        warmup_steps=float(settings["warmup_ratio"]),
        max_length=int(settings["max_length"]),
        assistant_only_loss=marked,
        completion_only_loss=not marked,
        packing=False,
        # Batches of similar length: toy trajectories range from 20 to 460 tokens, and random
        # batches spent more than half their compute on padding.
        train_sampling_strategy=str(settings["sampler"]),
        logging_steps=5,
        save_strategy="steps" if every else "no",
        save_steps=every or 500,  # (unused when save_strategy is "no")
        save_total_limit=1,  # the newest; the one before goes once the newest is complete
        report_to="none",
        seed=seed,
        data_seed=seed,
        dataloader_num_workers=0,
        **device_settings(precision),
    )
    trainer = _sft_trainer_class(precision.device)(
        model=model, args=config, train_dataset=Dataset.from_list(rows), processing_class=tokenizer
    )
    # what the numbers depend on besides the config
    environment = environment_record(model_dir, precision.device, start_sha256)
    started = time.time()
    if resume is not None:
        print(f"SFT: resuming {out} from {resume.name}", file=sys.stderr)
    result = trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    summary = {
        "examples": len(examples),
        "truncated_at_max_length": round(truncated, 4),
        "loss_on": "template marks" if marked else "completion after the prompt",
        "experts": list(experts),
        "train_loss": round(float(result.training_loss), 4),
        "steps": int(result.global_step),
        "seconds": round(time.time() - started, 1),
        "loss_curve": [round(float(h["loss"]), 4) for h in trainer.state.log_history if "loss" in h],
        "environment": environment,
    }
    from meml.data.tiny_models import save_atomically

    if trainer.is_world_process_zero():
        save_atomically(out / "model", tokenizer, trainer.accelerator.unwrap_model(trainer.model))
        shutil.rmtree(work, ignore_errors=True)
        atomic_write_json(out / "DONE", {**summary, "processes": trainer.accelerator.num_processes})
    trainer.accelerator.wait_for_everyone()
    return dict(json.loads((out / "DONE").read_text()))
