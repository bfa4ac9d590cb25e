"""The one normalised record that every data set is turned into, and its validation.

A record is a flat JSON object:
    id         unique within the data set, e.g. "gsm8k-test-00017"
    dataset    "gsm8k" | "strategyqa" | "mathqa" (toy sets use the same names: the format is what counts)
    split      "train" | "test"
    question   the question text (for MathQA without the options; the prompt adds them)
    answer     the gold answer in canonical form: an integer string for GSM8K, "yes"/"no" for
               StrategyQA, an option letter "a".."e" for MathQA
    rationale  the data set's own gold rationale, ending in the canonical answer line
    options    MathQA only: {"a": text, ..., "e": text}; null elsewhere
    source     where the record came from (file or hub id and its original split/index)
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from meml.core.io import DataError, atomic_write_jsonl, read_jsonl

DATASETS = ("gsm8k", "strategyqa", "mathqa")
SPLITS = ("train", "test")
OPTION_LETTERS = ("a", "b", "c", "d", "e")
_INTEGER = re.compile(r"-?\d+")


@dataclass(frozen=True)
class Record:
    id: str
    dataset: str
    split: str
    question: str
    answer: str
    rationale: str
    options: dict[str, str] | None
    source: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def check_dataset_name(name: str, where: str = "") -> str:
    if name not in DATASETS:
        raise DataError(f"unknown data set '{name}'; known: {', '.join(DATASETS)}", where or None)
    return name


def validate_record(obj: dict[str, Any], path: str | Path | None = None, line: int | None = None) -> Record:
    """Turn a parsed JSON object into a Record, or raise DataError naming file, line and field."""

    def need_str(field: str) -> str:
        if field not in obj:
            raise DataError("missing field", path, line, field)
        value = obj[field]
        if not isinstance(value, str) or not value.strip():
            raise DataError(f"must be a non-empty string, got {value!r}", path, line, field)
        return value

    for field in ("id", "dataset", "split", "question", "answer", "rationale", "source"):
        need_str(field)
    dataset = obj["dataset"]
    if dataset not in DATASETS:
        raise DataError(f"unknown data set '{dataset}'; known: {', '.join(DATASETS)}", path, line, "dataset")
    if obj["split"] not in SPLITS:
        raise DataError(f"split must be one of {SPLITS}, got {obj['split']!r}", path, line, "split")
    answer = obj["answer"]
    options = obj.get("options")
    if dataset == "gsm8k" and not _INTEGER.fullmatch(answer):
        raise DataError(f"GSM8K gold answer must be an integer, got {answer!r}", path, line, "answer")
    if dataset == "strategyqa" and answer not in ("yes", "no"):
        raise DataError(f"StrategyQA gold answer must be 'yes' or 'no', got {answer!r}", path, line, "answer")
    if dataset == "mathqa":
        if not isinstance(options, dict) or sorted(options) != list(OPTION_LETTERS):
            raise DataError(f"MathQA options must map each of a-e to a text, got {options!r}", path, line, "options")
        if answer not in OPTION_LETTERS:
            raise DataError(f"MathQA gold answer must be a letter a-e, got {answer!r}", path, line, "answer")
    elif options is not None:
        raise DataError(f"only MathQA records have options, got {options!r}", path, line, "options")
    return Record(
        id=obj["id"],
        dataset=dataset,
        split=obj["split"],
        question=obj["question"],
        answer=answer,
        rationale=obj["rationale"],
        options=dict(options) if options is not None else None,
        source=obj["source"],
    )


def read_records(path: str | Path, dataset: str | None = None) -> list[Record]:
    """Read and validate a prepared JSONL file; ids must be unique."""
    records = []
    seen: dict[str, int] = {}
    for line, obj in read_jsonl(path):
        record = validate_record(obj, path, line)
        if dataset is not None and record.dataset != dataset:
            raise DataError(f"expected data set '{dataset}', got '{record.dataset}'", path, line, "dataset")
        if record.id in seen:
            raise DataError(f"duplicate id '{record.id}' (first on line {seen[record.id]})", path, line, "id")
        seen[record.id] = line
        records.append(record)
    return records


def write_records(path: str | Path, records: list[Record]) -> int:
    return atomic_write_jsonl(path, (r.to_json() for r in records))
