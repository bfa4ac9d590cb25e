"""Experts: their system prompts, the chat messages they see, and their trajectory files.

An expert is one system prompt of one model (MEF trains a single model on all of them). The
paper does not print its prompts; ours are assumed and can be replaced in the config
(`experts.prompts`). Expert 0 writes like the data set's own rationale, expert 1 like
DeepSeek-R1 (a long chain in <think> tags), expert 2 like Doubao-1.5-thinking (solve, then
re-check and correct). Experts 3 and 4 exist for the number-of-experts study only (config
`experts.count`, default 3): expert 3 numbers the reference's steps, expert 4 states its answer
first and then justifies it.

A trajectory file `e<k>.jsonl` holds one object a line: {"id", "expert", "completion", "source"},
`id` being the question's record id.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from meml.core.answers import is_correct
from meml.core.io import DataError, atomic_write_jsonl, read_jsonl
from meml.core.records import Record

DEFAULT_PROMPTS: tuple[str, ...] = (
    "You are expert 0. Solve the problem briefly, in the style of the reference solution, "
    "and end with the answer line.",
    "You are expert 1. Think step by step inside <think> </think> tags, working through every "
    "small step in order, then give the answer line.",
    "You are expert 2. Solve the problem, then reflect: check each step another way, correct any "
    "mistake you find, and end with the answer line.",
    "You are expert 3. Write the solution as a numbered list of short steps, then the answer line.",
    "You are expert 4. State the answer you expect first, then justify it step by step, and end with the answer line.",
)


def prompts_of(cfg: dict[str, Any]) -> tuple[str, ...]:
    """The config's expert prompts: `experts.prompts` (or ours), the first `experts.count` of them."""
    prompts = tuple(cfg.get("experts", {}).get("prompts") or DEFAULT_PROMPTS)
    count = int(cfg.get("experts", {}).get("count") or 3)
    if count > len(prompts):
        raise DataError(f"{count} experts but only {len(prompts)} prompts", None, None, "experts.count")
    return prompts[:count]


def user_message(record: Record) -> str:
    """The question as the user turn; MathQA adds its options in the data set's own format."""
    if record.options:
        options = " , ".join(f"{k} ) {v}" for k, v in record.options.items())
        return f"{record.question}\nOptions: {options}"
    return record.question


def chat_messages(record: Record, expert: int, prompts: Sequence[str] = DEFAULT_PROMPTS) -> list[dict[str, str]]:
    if not 0 <= expert < len(prompts):
        raise DataError(f"unknown expert {expert}; this config has experts 0..{len(prompts) - 1}")
    return [{"role": "system", "content": prompts[expert]}, {"role": "user", "content": user_message(record)}]


def write_trajectories(path: str | Path, expert: int, items: list[tuple[Record, str]], source: str) -> int:
    """Write one expert's trajectories; every one must end in an answer the checker accepts (strict)."""
    rows = []
    for record, completion in items:
        if not is_correct(completion, record.dataset, record.answer, "strict", record.options):
            raise DataError(f"expert {expert} trajectory for {record.id} is not judged correct: {completion[-120:]!r}")
        rows.append({"id": record.id, "expert": expert, "completion": completion, "source": source})
    return atomic_write_jsonl(path, rows)


def read_trajectories(
    path: str | Path, records_by_id: dict[str, Record], as_sft_data: bool = True
) -> list[tuple[Record, int, str]]:
    """(record, expert, completion) triples; unknown ids and missing fields name the file and line.
    As SFT data (experts/<ds>/e<k>.jsonl) a question given twice and a trajectory whose answer the
    checker rejects are refused too; a bring-your-own teacher file may hold several tries."""
    from meml.core.answers import is_correct

    out = []
    seen: dict[str, int] = {}
    for line, row in read_jsonl(path):
        for field in ("id", "expert", "completion"):
            if field not in row:
                raise DataError("missing field", path, line, field)
        if row["id"] not in records_by_id:
            raise DataError(f"no question with id {row['id']!r} in the prepared data", path, line, "id")
        if not isinstance(row["expert"], int):
            raise DataError(f"expert must be an integer, got {row['expert']!r}", path, line, "expert")
        if not isinstance(row["completion"], str) or not row["completion"].strip():
            raise DataError("completion must be a non-empty string", path, line, "completion")
        if as_sft_data and row["id"] in seen:
            raise DataError(f"question {row['id']!r} appears twice (first on line {seen[row['id']]})", path, line, "id")
        seen[row["id"]] = line
        record = records_by_id[row["id"]]
        if as_sft_data and not is_correct(row["completion"], record.dataset, record.answer, "lenient", record.options):
            raise DataError(
                f"the answer checker rejects this trajectory (gold: {record.answer!r}); SFT data must be correct",
                path,
                line,
                "completion",
            )
        out.append((record, row["expert"], row["completion"]))
    return out


def trajectory_stats(completions: list[str]) -> dict[str, Any]:
    lengths = sorted(len(c.split()) for c in completions)
    if not lengths:
        return {"count": 0}
    return {
        "count": len(lengths),
        "words_mean": round(sum(lengths) / len(lengths), 1),
        "words_median": lengths[len(lengths) // 2],
        "words_max": lengths[-1],
    }


def gold_expert(data_dir: str | Path, dataset: str, out_dir: str | Path) -> int:
    """The real world's expert 0, who writes like the data set itself: each record's gold rationale,
    with the canonical answer line added where missing. (Experts 1.. come from teachers.py.)"""
    from meml.core.answers import canonical_answer_line
    from meml.core.records import read_records

    items = []
    for r in read_records(Path(data_dir) / "train.jsonl", dataset):
        text = r.rationale.strip()
        if not text:
            continue
        if not is_correct(text, dataset, r.answer, "strict", r.options):
            text = f"{text}\n{canonical_answer_line(dataset, r.answer)}"
        items.append((r, text))
    return write_trajectories(Path(out_dir) / "e0.jsonl", 0, items, f"{dataset} gold rationale")
