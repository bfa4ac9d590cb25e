"""Evaluation: greedy accuracy per expert prompt through lm-eval, and a majority vote of experts.

    meml eval --checkpoint DIR --dataset gsm8k --experts 0,1,2 --out eval.json [--base-model DIR]

For each expert the project's lm-eval task (pipeline/tasks/, regenerated for the config's prompts)
runs with the model's chat template and the expert's system prompt, greedy decoding, and the
answer checker as filter and metric (strict and lenient). The JSON holds per-expert strict and
lenient accuracy, every question's response and predictions per expert (lm-eval's logged
samples), the accuracy recomputed by calling the checker directly on the same responses (they
must agree), and the majority vote over the experts.

Majority vote (in each checker mode, of that mode's predictions): invalid answers do not vote;
the answer with the most votes wins; a tie goes to the tied answer given by the lowest-numbered
expert; no valid answer at all counts as wrong.

Everything that can be checked is checked before any generation: the checkpoint (present, with
weights, and not an unfinished run), the data file, the chat template, the experts.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from meml.core.answers import answers_match, extract
from meml.core.attention import attention_kwargs
from meml.core.io import DataError, atomic_write_json, locked
from meml.core.records import read_records
from meml.core.stops import stop_tokens
from meml.data.experts import DEFAULT_PROMPTS
from meml.evaluation.lm_tasks import MAX_GEN_TOKS, task_name, write_tasks
from meml.training.checkpoint import check_model_folder
from meml.training.rollout_vllm import VLLMSettings

BACKENDS = ("kv", "hf", "vllm")
TIE_RULE = "invalid answers do not vote; most votes wins; a tie goes to the lowest-numbered expert's answer"


def check_chat_template(path: Path) -> Any:
    """The model's tokenizer, which must have a chat template (the experts' prompts are system messages)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if not getattr(tokenizer, "chat_template", None):
        raise DataError("the model's tokenizer has no chat template; expert prompts need one", path)
    return tokenizer


def generation_overrides(tokenizer: Any, max_new_tokens: int | None) -> dict[str, Any]:
    """What evaluation changes in the tasks' generation settings: stop where the model's turn ends
    (stops.py: the same tokens the RL engines stop on), and the run's length cap."""
    out: dict[str, Any] = {"until": list(stop_tokens(tokenizer).texts)}
    if max_new_tokens:
        out["max_gen_toks"] = max_new_tokens
    return out


def majority_vote(predictions: Sequence[str | None]) -> str | None:
    """The documented tie rule: most votes; ties to the lowest-numbered expert's answer."""
    votes = Counter(p for p in predictions if p is not None)
    if not votes:
        return None
    best = max(votes.values())
    return next(p for p in predictions if p is not None and votes[p] == best)


def score_expert(
    responses: Sequence[tuple[Any, str]],
    dataset: str,
    cap: int,
    tokenizer: Any,
    per_question: dict[str, dict[str, Any]],
    expert: str,
) -> dict[str, Any]:
    """Score one expert's (record, response) pairs into per_question[id][expert] and return the
    expert's accuracies. A response is finished when it re-tokenises to fewer than `cap` tokens
    (lm-eval returns text, not tokens); a cut one is wrong in every mode and abstains from the vote
    (its answers are None), and is counted in `cut_correct_looking` when the checker would have
    taken it."""
    correct = {"strict": 0, "lenient": 0}
    cut_correct = {"strict": 0, "lenient": 0}
    finished = 0
    for record, response in responses:
        done = len(tokenizer(response, add_special_tokens=False)["input_ids"]) < cap
        entry: dict[str, Any] = {"response": response, "finished": done}
        for mode in ("strict", "lenient"):
            answer = extract(response, dataset, mode, record.options)
            looks_right = answers_match(answer, record.answer, dataset)
            entry[mode] = answer if done else None
            entry[f"{mode}_correct"] = done and looks_right
            correct[mode] += done and looks_right
            cut_correct[mode] += not done and looks_right
        per_question[record.id][expert] = entry
        finished += done
    n = len(responses)
    return {
        "strict": correct["strict"] / n,
        "lenient": correct["lenient"] / n,
        "cut_correct_looking": cut_correct,
        "finished": finished / n,
    }


def vote(per_question: dict[str, dict[str, Any]], experts: Sequence[int], dataset: str) -> dict[str, Any]:
    """The majority vote in both checker modes (each table scores in the config's mode), written
    into each question as majority_vote_<mode>; returns its accuracies."""
    out: dict[str, Any] = {"experts": [int(k) for k in experts], "tie_rule": TIE_RULE}
    for mode in ("strict", "lenient"):
        voted = 0
        for q in per_question.values():
            chosen = majority_vote([q[f"e{k}"][mode] for k in experts])
            q[f"majority_vote_{mode}"] = chosen
            voted += answers_match(chosen, q["gold"], dataset)
        out[mode] = voted / len(per_question)
    return out


def rescore(report: dict[str, Any], records: Sequence[Any], cap: int, tokenizer: Any) -> dict[str, Any]:
    """An evaluation block ("model" or "base") written before cut answers scored 0, scored again from
    its stored responses under today's rule; lm-eval's own scores (its old strict and lenient) are
    kept as `lm_eval`. Nothing is generated: the responses are the ones the evaluation wrote."""
    by_id = {r.id: r for r in records}
    dataset = report["dataset"]
    samples = report["samples"]
    per_question = {q["id"]: {"id": q["id"], "gold": q["gold"]} for q in samples}
    for name, old in report["experts"].items():
        responses = [(by_id[q["id"]], q[name]["response"]) for q in samples if name in q]
        summary = score_expert(responses, dataset, cap, tokenizer, per_question, name)
        lm_eval_scores = old.get("lm_eval") or {"strict": old["strict"], "lenient": old["lenient"]}
        kept = {k: v for k, v in old.items() if k in ("seconds", "seconds_per_100_questions")}
        report["experts"][name] = {**summary, "lm_eval": lm_eval_scores, **kept}
    if "majority_vote" in report:
        report["majority_vote"] = vote(per_question, report["majority_vote"]["experts"], dataset)
    report["samples"] = list(per_question.values())
    report["rescored"] = "cut answers score 0 (scored again from the stored responses)"
    return report


def _make_model(
    checkpoint: Path, backend: str, batch_size: int, device: str, dtype: str, vllm: VLLMSettings | None = None
) -> Any:
    if backend == "kv":  # lm-eval's hf model, generating with the CPU sampling engine (kv_lm.py)
        from meml.evaluation.kv_lm import KVLM
        from meml.training.kv_decode import UnsupportedModel

        try:
            return KVLM(
                pretrained=str(checkpoint),
                device=device,
                dtype=dtype,
                batch_size=batch_size,
                **attention_kwargs(device),
            )
        except UnsupportedModel as err:
            raise DataError(f"{err} (eval.backend: hf)", checkpoint) from None
    if backend == "hf":
        from lm_eval.models.huggingface import HFLM

        return HFLM(
            pretrained=str(checkpoint), device=device, dtype=dtype, batch_size=batch_size, **attention_kwargs(device)
        )
    if backend == "vllm":  # lm-eval's own vLLM model, with the settings RL's vLLM engine uses (rl.vllm)
        from meml.training.rollout_vllm import in_process, require_vllm

        with in_process():  # importing vLLM sets variables too
            require_vllm()
            from lm_eval.models.vllm_causallms import VLLM

            if vllm is None:
                raise DataError("eval.backend vllm needs rl.vllm's settings (config/default.yaml has them)")
            kwargs = vllm.llm_kwargs(device)
            return VLLM(pretrained=str(checkpoint), dtype=dtype, batch_size="auto", seed=0, **kwargs)
    raise DataError(f"unknown evaluation backend '{backend}'; known: {', '.join(BACKENDS)}")


def evaluate_model(
    checkpoint: str | Path,
    dataset: str,
    experts: Sequence[int],
    data_root: str | Path,
    *,
    prompts: Sequence[str] = DEFAULT_PROMPTS,
    backend: str = "kv",
    batch_size: int = 32,
    device: str = "cpu",
    dtype: str | None = None,
    limit: int | None = None,
    world: str = "toy",
    max_new_tokens: int | None = None,
    vllm: VLLMSettings | None = None,
) -> dict[str, Any]:
    """Evaluate one model on one data set's test split under each expert's prompt.
    `max_new_tokens` overrides the tasks' generation limit (the tasks allow 384-512); `vllm`: the
    config's rl.vllm, for backend vllm."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    folder = check_model_folder(checkpoint)
    for k in experts:
        if not 0 <= k < len(prompts):
            raise DataError(f"unknown expert {k}; this config has experts 0..{len(prompts) - 1}")
    records = read_records(Path(data_root) / dataset / "test.jsonl", dataset)[: limit or None]
    tokenizer = check_chat_template(folder)
    overrides = generation_overrides(tokenizer, max_new_tokens)
    cap = max_new_tokens or MAX_GEN_TOKS[dataset]
    by_id = {r.id: r for r in records}
    dtype = dtype or ("float32" if device == "cpu" else "bfloat16")
    model = _make_model(folder, backend, batch_size, device, dtype, vllm)
    out: dict[str, Any] = {
        "checkpoint": str(folder),
        "dataset": dataset,
        "questions": len(records),
        "backend": backend,
        # eval.batch_size changes a greedy token only at round-off (a run key, core/config.RUN_KEYS): recorded
        "batch_size": "auto" if backend == "vllm" else batch_size,
        "experts": {},
    }
    per_question: dict[str, dict[str, Any]] = {r.id: {"id": r.id, "gold": r.answer} for r in records}
    with tempfile.TemporaryDirectory() as tasks_dir:
        write_tasks(Path(tasks_dir), prompts)
        # the task reads exactly these questions (not lm-eval's `limit`, whose choice may differ);
        # custom_dataset hooks get their kwargs from the TaskManager's metadata
        metadata = {"data_root": str(data_root), "max_questions": limit or 0}
        manager = TaskManager(include_path=tasks_dir, include_defaults=False, metadata=metadata)
        for k in experts:
            name = task_name(world, dataset, k)
            started = time.time()
            result = lm_eval.simple_evaluate(
                model=model,
                tasks=[name],
                task_manager=manager,
                apply_chat_template=True,
                log_samples=True,
                metadata=metadata,
                gen_kwargs=overrides,
                bootstrap_iters=0,
            )
            seconds = time.time() - started
            assert result is not None
            scores = result["results"][name]
            responses = [
                (by_id[sample["doc"]["id"]], sample["resps"][0][0])
                for sample in result["samples"][name]
                if sample["filter"] == "lenient"
            ]
            summary = score_expert(responses, dataset, cap, tokenizer, per_question, f"e{k}")
            out["experts"][f"e{k}"] = {
                **summary,
                # lm-eval's own scoring of the same responses, which does not know the cap
                "lm_eval": {"strict": scores["accuracy,strict"], "lenient": scores["accuracy,lenient"]},
                "seconds": round(seconds, 2),
                "seconds_per_100_questions": round(100 * seconds / len(records), 2),
            }
    if len(experts) > 1:  # the vote in both checker modes: each table scores in the config's mode
        out["majority_vote"] = vote(per_question, experts, dataset)
    out["samples"] = list(per_question.values())
    return out


@locked("out_json", folder=False)  # one writer of an evaluation file
def evaluate(
    checkpoint: str | Path,
    dataset: str,
    experts: Sequence[int],
    data_root: str | Path,
    out_json: str | Path,
    *,
    base_model: str | Path | None = None,
    mlflow_run_id: str | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Evaluate a checkpoint (and, if given, the untrained base the same way); write one JSON.
    `mlflow_run_id`, the run of the cell this checkpoint came from, is written into it."""
    report: dict[str, Any] = {"model": evaluate_model(checkpoint, dataset, experts, data_root, **kwargs)}
    if base_model is not None:
        report["base"] = evaluate_model(base_model, dataset, experts, data_root, **kwargs)
    if mlflow_run_id is not None:
        report["mlflow_run_id"] = mlflow_run_id
    atomic_write_json(out_json, report)
    return report
