"""lm-eval hooks for the project's tasks: load prepared records, build the question, extract and
score answers through the project's answer checker (meml.core.answers), strict and lenient."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from meml.core.answers import answers_match, extract
from meml.core.records import read_records, validate_record
from meml.data.experts import user_message

INVALID = "[invalid]"


def load_prepared(**kwargs: Any) -> dict[str, Any]:
    """The test split of a prepared data set. `--metadata '{"data_root": DIR}'` overrides the
    task's default folder (relative paths are from the working directory)."""
    from datasets import Dataset

    root = Path(kwargs.get("data_root") or kwargs["default_data_root"])
    records = read_records(root / kwargs["dataset"] / "test.jsonl", kwargs["dataset"])
    limit = kwargs.get("max_questions")
    if limit:
        records = records[: int(limit)]
    return {"test": Dataset.from_list([r.to_json() for r in records])}


def doc_to_text(doc: dict[str, Any]) -> str:
    return user_message(validate_record(doc))


def _extract_all(resps: list[list[str]], docs: list[dict[str, Any]], mode: str) -> list[list[str]]:
    return [
        [extract(r, doc["dataset"], mode, doc.get("options")) or INVALID for r in doc_resps]
        for doc_resps, doc in zip(resps, docs, strict=True)
    ]


def extract_strict(resps: list[list[str]], docs: list[dict[str, Any]]) -> list[list[str]]:
    return _extract_all(resps, docs, "strict")


def extract_lenient(resps: list[list[str]], docs: list[dict[str, Any]]) -> list[list[str]]:
    return _extract_all(resps, docs, "lenient")


def accuracy(references: list[str], predictions: list[str], **_: Any) -> float:
    """1.0 when the extracted answer equals the gold (numerically for numbers)."""
    prediction, gold = predictions[0], references[0]
    if prediction == INVALID:
        return 0.0
    dataset = "gsm8k" if gold.lstrip("-").isdigit() else "other"
    return float(answers_match(prediction, gold, dataset))
