"""One RL cell trained by trl's GRPOTrainer instead of our loop, for the side-by-side comparison
(config `trl.methods`; the report's `trl` table and figure).

Held equal to the cell trained by training/rl.py:
    the start      the cell's SFT model (the same folder)
    the questions  the same ones in the same order: QuestionOrder with the cell's seed, Q a step
                   (rl.steps, or rl.epochs passes), handed to trl as a dataset it must not shuffle
    the prompt     the rollout expert's system prompt through the model's chat template
    the stops      a completion ends at our stop tokens (core/stops.py), set as the model's eos ids,
                   which is also where trl's loss mask ends it
    the reward     core/answers.score, an answer cut at the cap scoring 0 (a completion is cut when
                   its last token ends no turn)
    the update     G, lr with our warm-up (the same AdamW and LambdaLR, handed to trl), the clip,
                   beta, max_grad_norm, one update a batch, the advantage's kind (grpo: scale by
                   the group's std; drgrpo: no scaling, trl's dr_grpo loss), temperature and top-p,
                   the answer cap; the batch's gradient taken in micro-batches that fit
                   rl.micro_batch_tokens, as ours is (trl divides each micro-batch's loss by their
                   number, so the step's gradient is the whole batch's)
Different by trl's design: its std has +1e-4 (ours none; a flat group gets 0 either way), its own
loss code, generation by transformers' `generate` (or trl's colocated vLLM: `trl.vllm`, with trl's
importance weight against vLLM's log-probs off, as our loop takes none).
Only a method trl can express runs here: one rollout expert, no IML, no HSFT, no dynamic sampling.

Writes out/{metrics.jsonl, model/, DONE}: per step reward/mean, perf/step_seconds and
completion/length_mean as our loop names them, perf/wall_seconds since the first step began and
perf/step_tokens_per_second (completion tokens per second of the whole step: generation and update).
A run cut short starts over (trl's checkpoints are not resumed here).
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meml.core.answers import RewardConfig, score
from meml.core.attention import attention_kwargs
from meml.core.io import DataError, atomic_write_json
from meml.core.precision import Precision, resolve
from meml.core.records import Record, read_records
from meml.core.stops import stop_tokens
from meml.data.experts import DEFAULT_PROMPTS, chat_messages
from meml.training.groups import QuestionOrder

PROMPT_TOKENS = 256  # a prompt's length, for sizing the update's micro-batches (ours measures each row)


@dataclass(frozen=True)
class TRLCell:
    """What the trl run of a cell needs: the cell's RL settings and method, as our loop gets them."""

    settings: Any  # rl.RLSettings
    method: Any  # rl.Method
    seed: int
    prompts: tuple[str, ...] = DEFAULT_PROMPTS
    reward: RewardConfig = field(default_factory=RewardConfig)
    precision: Precision | None = None
    vllm: bool = False  # generate through trl's colocated vLLM instead of transformers


def expressible(method: Any) -> str | None:
    """Why trl's GRPOTrainer cannot run this method, or None when it can."""
    if len(method.rl_experts) != 1:
        return f"it samples from {len(method.rl_experts)} experts (trl's group is one prompt's completions)"
    if method.iml or method.hsft or method.dynamic_sampling or method.shuffle_advantages:
        return "it uses IML, HSFT, dynamic sampling or shuffled advantages, which trl's GRPOTrainer does not have"
    return None


def steps_of(settings: Any, questions: int) -> int:
    """The RL steps, as our loop counts them: rl.steps, or rl.epochs passes over the questions."""
    if settings.epochs is None:
        return int(settings.steps)
    return math.ceil(settings.epochs * questions / settings.questions_per_step)


def question_rows(records: list[Record], cell: TRLCell) -> list[dict[str, Any]]:
    """Our loop's questions in its order, one row per question a step, under the rollout expert's prompt."""
    s = cell.settings
    order = QuestionOrder(len(records), cell.seed)
    expert = cell.method.rl_experts[0]
    rows = []
    for _ in range(steps_of(s, len(records))):
        for i in order.take(s.questions_per_step):
            r = records[i]
            rows.append({"prompt": chat_messages(r, expert, cell.prompts), "answer": r.answer,
                         "options": json.dumps(r.options), "dataset": r.dataset, "id": r.id})  # fmt: skip
    return rows


def reward_function(config: RewardConfig, stop_ids: tuple[int, ...]) -> Any:
    """Our reward as trl calls a reward function: a completion whose last token ends no turn was cut
    at the cap, and scores 0 (core/answers.score)."""

    def reward(completions: list[Any], completion_ids: list[list[int]], answer: list[str], options: list[str],
               dataset: list[str], **_: Any) -> list[float | None]:  # fmt: skip
        return [
            score(c[0]["content"], ds, a, json.loads(o), config, bool(ids) and ids[-1] in stop_ids)[1]
            for c, ids, a, o, ds in zip(completions, completion_ids, answer, options, dataset, strict=True)
        ]

    return reward


def run_trl_grpo(cell: TRLCell, start: Path, data: Path, out: Path) -> dict[str, Any]:
    """Train `start` on `data`/train.jsonl with trl's GRPOTrainer; writes out/ (see the module)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    why = expressible(cell.method)
    if why:
        raise DataError(f"trl's GRPOTrainer cannot run {cell.method.name}: {why}", None, None, "trl.methods")
    s, precision = cell.settings, cell.precision or resolve("cpu")
    if s.updates_per_batch != 1:
        raise DataError("the trl comparison takes one update a batch", None, None, "rl.updates_per_batch")
    if (out / "DONE").is_file():
        return dict(json.loads((out / "DONE").read_text()))
    shutil.rmtree(out, ignore_errors=True)  # a run cut short starts over: trl's own resume is not ours
    out.mkdir(parents=True)
    torch.manual_seed(cell.seed)
    tokenizer = AutoTokenizer.from_pretrained(start)
    stops = stop_tokens(tokenizer)
    model = AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32, **attention_kwargs(precision.device))
    # trl stops a completion, and masks what follows it, at the generation config's eos ids (with the
    # tokenizer's eos): ours, so that a turn ends where our engines end it (Qwen2.5's base models end
    # turns with <|im_end|> but declare <|endoftext|>)
    model.generation_config.eos_token_id = list(stops.ids)
    records = read_records(data / "train.jsonl")
    rows = question_rows(records, cell)
    steps = steps_of(s, len(records))
    # the update in micro-batches of rows that fit rl.micro_batch_tokens (the batch's gradient is the
    # same: trl divides each micro-batch's loss by their number), generating the whole step at once
    rollouts = s.questions_per_step * s.group_size
    fits = max(1, s.micro_batch_tokens // (s.max_new_tokens + PROMPT_TOKENS))
    micro = next(k for k in range(1, rollouts + 1) if rollouts % k == 0 and rollouts // k <= fits)

    # our optimiser and schedule, handed to trl: AdamW without weight decay, lr warmed up over RL steps
    optimizer = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=0.0)
    warmup = max(1, s.warmup_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / warmup))
    drgrpo = cell.method.advantage == "drgrpo"
    config = GRPOConfig(
        output_dir=str(out / "work"),
        per_device_train_batch_size=rollouts // micro,
        gradient_accumulation_steps=micro,
        steps_per_generation=micro,
        num_iterations=1,
        num_generations=s.group_size,
        max_completion_length=s.max_new_tokens,
        max_steps=steps,
        learning_rate=s.lr,
        beta=s.beta,
        epsilon=s.clip_eps,
        max_grad_norm=s.max_grad_norm,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=0,
        loss_type="dr_grpo" if drgrpo else "grpo",
        scale_rewards="none" if drgrpo else "group",
        shuffle_dataset=False,
        seed=cell.seed,
        use_cpu=precision.device == "cpu",
        bf16=precision.dtype == "bfloat16",
        gradient_checkpointing=False,
        use_vllm=cell.vllm,
        vllm_mode="colocate",
        # our loop takes no importance weight against the sampler's log-probs; trl's vLLM path would
        vllm_importance_sampling_correction=False,
        # vLLM reads the model folder's generation config, not the one set above: our stops, named
        generation_kwargs={"stop_token_ids": list(stops.ids)} if cell.vllm else None,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    log: list[dict[str, float]] = []
    clock: dict[str, float] = {}

    class StepLog(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            clock["step"] = time.time()
            clock.setdefault("start", clock["step"])

        def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            logs = kwargs.get("logs") or {}
            if "reward" not in logs:
                return
            now = time.time()
            seconds = now - clock["step"]
            length = float(logs.get("completions/mean_length", 0.0))
            log.append({"step": state.global_step - 1, "reward/mean": float(logs["reward"]),
                          "completion/length_mean": length, "perf/step_seconds": seconds,
                          "perf/wall_seconds": now - clock["start"],
                          "perf/step_tokens_per_second": length * rollouts / max(seconds, 1e-9)})  # fmt: skip

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward_function(cell.reward, stops.ids)],
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[StepLog()],
        optimizers=(optimizer, scheduler),
    )
    started = time.time()
    trainer.train()
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log), encoding="utf-8")
    trainer.save_model(str(out / "model"))
    tokenizer.save_pretrained(out / "model")
    shutil.rmtree(out / "work", ignore_errors=True)
    import trl

    summary = {
        "method": cell.method.name,
        "steps": len(log),
        "reward_first": log[0]["reward/mean"] if log else None,
        "reward_last": log[-1]["reward/mean"] if log else None,
        "micro_batches": micro,
        "seconds": round(time.time() - started, 1),
        "generation": "vllm (colocated)" if cell.vllm else "transformers generate",
        "trl": trl.__version__,
        "precision": precision.dtype,
    }
    atomic_write_json(out / "DONE", summary)
    return summary
