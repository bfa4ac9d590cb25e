"""The calibration gate: is an MEF model in the regime the paper is about, before RL spends time on it?

Measured on one SFT model (one model, data set and SFT variant), under each of its experts' prompts:
    rollout_success[e]  share of correct samples on training questions, at RL's temperature and
                        length cap (GRPO starves near 0 and has nothing to learn near 1)
    finished[e]         share of those samples that ended within the cap (a cut answer scores 0)
    mixed_groups[e]     share of training questions whose `samples` samples disagree, some right
                        and some wrong: a GRPO subgroup gets a non-zero advantage only then (without
                        a format bonus). A subgroup larger than `samples` is mixed more often, so
                        this is a lower bound on the share of RL's subgroups that carry a gradient
                        (informative only: no range)
    greedy_accuracy     the headline expert's greedy accuracy on test questions (evaluation's reading)
    heldout             the headline expert on the same test questions, k = rl.group_size samples
                        each at RL's sampling: pass@1 (the share of correct samples) against pass@k
                        (the share of questions with a correct sample). The gap is the headroom RL
                        can turn into pass@1: what the model sometimes gets right and could learn to
                        get right every time (informative only: no range)
    answer_balance      the largest answer class's share of the test split (StrategyQA: a constant
                        answer scores it; MathQA: a constant letter does), for the chance level
Each value is checked against `calibration.ranges` (with the data set's `ranges_by_dataset` entry
laid over it); outside, `calibration.gate: stop` ends the
workflow before RL with a message naming the value, its range and the settings that move it, and
`warn` records it for the report.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from meml.core.answers import is_correct
from meml.core.io import DataError, atomic_write_json
from meml.core.precision import Precision, resolve
from meml.core.records import read_records
from meml.data.experts import chat_messages
from meml.training.engines import close_engine, sampling_job_engine
from meml.training.rollout import Sampling, prompt_ids
from meml.training.rollout_vllm import VLLMSettings

# the settings that move each measurement, named in the gate's message
MOVED_BY = {
    "rollout_success": "toy.pretrain.steps, sft.epochs, sft.lr, toy.sizes (more SFT data), rl.temperature",
    "greedy_accuracy": "toy.pretrain.steps, sft.epochs, sft.lr, toy.sizes (more SFT data)",
    "finished": "rl_by_dataset.<ds>.max_new_tokens (or rl.max_new_tokens), sft.epochs",
}


class CalibrationError(DataError):
    """An MEF model outside the informative range, with the gate set to stop."""


def sample_correct(engine: Any, tokenizer: Any, records: list[Any], experts: Sequence[int], n: int,
                   sampling: Sampling, prompts: Sequence[str], mode: str) -> dict[int, list[list[Any]]]:  # fmt: skip
    """expert -> one list per record of its n samples' (correct, finished, tokens); every expert's
    prompts go through the engine together (fewer, fuller batches)."""
    asked = [(k, r) for k in experts for r in records]
    outs = engine.generate([prompt_ids(tokenizer, chat_messages(r, k, prompts)) for k, r in asked], n, sampling)
    found: dict[int, list[list[Any]]] = {k: [] for k in experts}
    for (k, record), samples in zip(asked, outs, strict=True):
        found[k].append([
            (is_correct(c.text, record.dataset, record.answer, mode, record.options, c.finished), c.finished,
             len(c.token_ids))
            for c in samples
        ])  # fmt: skip
    return found


def _sample(engine: Any, tokenizer: Any, records: list[Any], experts: Sequence[int], n: int,
            sampling: Sampling, prompts: Sequence[str], mode: str) -> dict[int, tuple[float, ...]]:  # fmt: skip
    """expert -> (share correct, share finished, mean tokens, share of records whose n samples
    disagree) under that expert's prompt."""
    out: dict[int, tuple[float, ...]] = {}
    for k, per_record in sample_correct(engine, tokenizer, records, experts, n, sampling, prompts, mode).items():
        every = [s for samples in per_record for s in samples]
        total = max(len(every), 1)
        mixed = sum(0 < sum(c for c, _, _ in samples) < len(samples) for samples in per_record)
        out[k] = (
            sum(c for c, _, _ in every) / total,
            sum(f for _, f, _ in every) / total,
            sum(t for _, _, t in every) / total,
            mixed / max(len(per_record), 1),
        )
    return out


def pass_at(per_record: list[list[Any]]) -> dict[str, float]:
    """pass@1 (the share of correct samples) and pass@k (the share of records with a correct one),
    k the samples per record."""
    k = len(per_record[0]) if per_record else 0
    return {
        "k": k,
        "pass_at_1": round(sum(c for samples in per_record for c, _, _ in samples) / max(k * len(per_record), 1), 4),
        "pass_at_k": round(sum(any(c for c, _, _ in samples) for samples in per_record) / max(len(per_record), 1), 4),
    }


def answer_balance(answers: Sequence[str]) -> dict[str, Any]:
    counts = Counter(a.strip().lower() for a in answers)
    top, n = counts.most_common(1)[0]
    return {"largest_class": top, "largest_share": round(n / len(answers), 4), "classes": len(counts)}


def measure(
    model_dir: str | Path,
    data_root: str | Path,
    dataset: str,
    experts: Sequence[int],
    headline: int,
    sampling: Sampling,
    *,
    train_questions: int,
    samples: int,
    test_questions: int | None,
    heldout_samples: int = 0,
    prompts: Sequence[str],
    mode: str,
    seed: int,
    precision: Precision | None = None,
    engine_name: str = "kv",
    vllm: VLLMSettings | None = None,
) -> dict[str, Any]:
    """`engine_name`: rl.engine. The model is sampled on precision.device through the engine that
    names there (engines.sampling_job_engine: vLLM on a GPU under rl.engine vllm, the kv engine on a CPU)."""
    import torch
    from transformers import AutoTokenizer

    torch.manual_seed(seed)
    precision = precision or resolve("cpu")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    engine = sampling_job_engine(model_dir, tokenizer, precision, engine_name, vllm, seed)
    train = read_records(Path(data_root) / dataset / "train.jsonl")[:train_questions]
    test = read_records(Path(data_root) / dataset / "test.jsonl")
    out: dict[str, Any] = {
        "model": str(model_dir),
        "dataset": dataset,
        "train_questions": len(train),
        "samples": samples,
        "temperature": sampling.temperature,
        "max_new_tokens": sampling.max_new_tokens,
        "rollout_success": {},
        "finished": {},
        "mean_tokens": {},  # per expert: a MEF model that ignores its expert prompts writes one length for all
        "mixed_groups": {},  # per expert: questions whose samples disagree (GRPO's signal)
    }
    for k, (success, finished, tokens, mixed) in _sample(
        engine, tokenizer, train, experts, samples, sampling, prompts, mode
    ).items():
        out["rollout_success"][f"e{k}"], out["finished"][f"e{k}"] = round(success, 4), round(finished, 4)
        out["mean_tokens"][f"e{k}"] = round(tokens, 1)
        out["mixed_groups"][f"e{k}"] = round(mixed, 4)
    greedy = Sampling(sampling.max_new_tokens, greedy=True)
    shown = test[: test_questions or None]
    accuracy, greedy_finished, _, _ = _sample(engine, tokenizer, shown, [headline], 1, greedy, prompts, mode)[headline]
    out["greedy"] = {"expert": headline, "questions": len(shown), "accuracy": round(accuracy, 4),
                     "finished": round(greedy_finished, 4)}  # fmt: skip
    if heldout_samples:  # the headroom RL can turn into pass@1, on the same test questions
        drawn = sample_correct(engine, tokenizer, shown, [headline], heldout_samples, sampling, prompts, mode)
        out["heldout"] = {"expert": headline, "questions": len(shown), **pass_at(drawn[headline])}
    out["answer_balance"] = answer_balance([r.answer for r in test]) if dataset != "gsm8k" else None
    close_engine(engine)
    return out


LABELS = {"rollout_success": "rollout success", "finished": "finished share", "greedy_accuracy": "greedy accuracy"}


def ranges_for(settings: dict[str, Any], dataset: str) -> tuple[dict[str, list[float]], set[str]]:
    """`calibration.ranges` with the data set's `ranges_by_dataset` entry laid over it, and the
    keys that entry sets: the informative range sits above each data set's chance level (a yes/no
    guess scores half of StrategyQA, a letter guess a fifth of MathQA)."""
    own = (settings.get("ranges_by_dataset") or {}).get(dataset) or {}
    return {**settings["ranges"], **own}, set(own)


def out_of_range(result: dict[str, Any], ranges: dict[str, list[float]]) -> list[tuple[str, str, float]]:
    """(measurement, expert e.g. "e1", value) of every value outside its range, in a fixed order."""
    greedy = result["greedy"]
    measured = [
        ("rollout_success", result["rollout_success"]),
        ("finished", result["finished"]),
        ("greedy_accuracy", {f"e{greedy['expert']}": greedy["accuracy"]}),
    ]
    return [
        (key, expert, value)
        for key, values in measured
        for expert, value in values.items()
        if not ranges[key][0] <= value <= ranges[key][1]
    ]


def check(result: dict[str, Any], ranges: dict[str, list[float]], own: Collection[str] = ()) -> list[str]:
    """One line per value outside its range: the value, the range (`own`: the keys whose range is
    the data set's own, calibration.ranges_by_dataset), the settings that move it."""
    dataset = result["dataset"]
    return [
        f"expert {expert[1:]}'s {LABELS[key]} {value:.2f} is outside "
        f"calibration.{f'ranges_by_dataset.{dataset}' if key in own else 'ranges'}.{key} "
        f"[{ranges[key][0]}, {ranges[key][1]}]; change {MOVED_BY[key].replace('<ds>', result['dataset'])}"
        for key, expert, value in out_of_range(result, ranges)
    ]


def calibrate(
    out_json: str | Path,
    gate: str,
    ranges: dict[str, list[float]],
    where: str,
    own: Collection[str] = (),
    **kwargs: Any,
) -> dict[str, Any]:
    """Measure, check, write the JSON (with the problems found); with gate "stop", raise after writing
    a `.failed` note beside it, which the workflow prints when it stops."""
    result = measure(**kwargs)
    result["ranges"] = ranges
    result["problems"] = check(result, ranges, own)
    result["in_range"] = not result["problems"]
    Path(out_json).parent.mkdir(parents=True, exist_ok=True)
    failed = Path(out_json).with_suffix(".failed")
    failed.unlink(missing_ok=True)
    if result["problems"] and gate == "stop":
        text = f"calibration of {where} (calibration.gate: stop):\n" + "\n".join(f"  {p}" for p in result["problems"])
        failed.write_text(text + "\n", encoding="utf-8")
        raise CalibrationError(text)
    atomic_write_json(out_json, result)
    return result
