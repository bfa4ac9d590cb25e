"""Loaders for the real GSM8K, StrategyQA and MathQA, each turned into `Record`s.

Real use loads a data set by its hub id through `datasets`; a config key (`local`) points it at
a folder of the original files instead. Splits (see README, "Data"):

    gsm8k       train 7473 / test 1319, the official files.
    strategyqa  the 2290 labelled questions of the official train set (its test set has no labels),
                de-duplicated on the stripped question text (2289 remain), ordered by the SHA-256 of
                that text; the first `test_size` (687, the size of the common 70/30 split) are test,
                the rest train. Keyed on the text, so the official JSON, BIG-bench's task.json and a
                hub copy all give the same split and ids, and no duplicate straddles the split.
    mathqa      train.json / test.json (29837 / 2985); when train.json is absent, dev.json (4475) is
                used as train, and each record's `source` says so.
"""

from __future__ import annotations

import ast
import hashlib
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from meml.core.answers import canonical_answer_line
from meml.core.io import DataError, read_json, read_jsonl
from meml.core.records import OPTION_LETTERS, Record, check_dataset_name

HUB_DEFAULTS: dict[str, dict[str, Any]] = {
    "gsm8k": {"hub_id": "openai/gsm8k", "hub_config": "main"},
    "strategyqa": {"hub_id": "ChilleD/StrategyQA", "hub_config": None},
    "mathqa": {"hub_id": "allenai/math_qa", "hub_config": None},
}
STRATEGYQA_TEST_SIZE = 687


# --------------------------------------------------------------------------- GSM8K


def gsm8k_gold(answer: str, where: str = "", line: int | str | None = None) -> str:
    if "####" not in answer:
        raise DataError("GSM8K answer has no '#### <gold>' line", where or None, line, "answer")
    gold = answer.split("####")[-1].strip().replace(",", "").replace("$", "")
    if not re.fullmatch(r"-?\d+", gold):
        raise DataError(f"GSM8K gold is not an integer: {gold!r}", where or None, line, "answer")
    return gold


def normalise_gsm8k(
    rows: Iterable[tuple[int | str, dict[str, Any]]], split: str, source: str, label: str | None = None
) -> list[Record]:
    """rows: (line number, row). `source` names the file in errors; `label` goes into each record."""
    label = label or source
    records = []
    first_seen: dict[str, list[int | str]] = {}
    for index, (line, row) in enumerate(rows):
        for field in ("question", "answer"):
            if not isinstance(row.get(field), str) or not row[field].strip():
                raise DataError("missing or empty field", source, line, field)
        gold = gsm8k_gold(row["answer"], source, line)
        rationale = re.sub(r"<<.*?>>", "", row["answer"]).strip()  # calculator notes are not prose
        first_seen.setdefault(row["question"].strip(), []).append(line)
        records.append(
            Record(
                f"gsm8k-{split}-{index:05d}",
                "gsm8k",
                split,
                row["question"].strip(),
                gold,
                rationale,
                None,
                f"{label}#{index}",
            )
        )
    repeated = {q: lines for q, lines in first_seen.items() if len(lines) > 1}
    if repeated:  # kept (ids follow the file), but said: a duplicate weighs twice in training
        extra = sum(len(lines) - 1 for lines in repeated.values())
        example = next(iter(repeated.values()))
        print(
            f"{source}: {len(repeated)} question(s) appear more than once ({extra} extra row(s); "
            f"e.g. lines {', '.join(map(str, example))})",
            file=sys.stderr,
        )
    return records


# --------------------------------------------------------------------------- StrategyQA


def strategyqa_id(question: str) -> str:
    return "strategyqa-" + hashlib.sha256(question.strip().encode()).hexdigest()[:12]


def _sqa_fields(row: dict[str, Any], where: str, line: int | str | None) -> tuple[str, str, str]:
    """(question, yes/no, explanation) from an official-format or BIG-bench-format row."""
    if "input" in row and "target_scores" in row:  # BIG-bench task.json example
        scores = row["target_scores"]
        if not isinstance(scores, dict) or "Yes" not in scores:
            raise DataError("BIG-bench example needs target_scores with 'Yes'", where, line, "target_scores")
        answer = "yes" if scores["Yes"] == 1 else "no"
        target = str(row.get("target", ""))
        explanation = re.sub(r"^\s*(yes|no)\.?\s*", "", target, flags=re.IGNORECASE).strip()
        return str(row["input"]), answer, explanation
    if "question" not in row:
        raise DataError("missing field", where, line, "question")
    if "answer" not in row:
        raise DataError("missing field", where, line, "answer")
    value = row["answer"]
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no"):
        value = value.lower() in ("true", "yes")
    if not isinstance(value, bool):
        raise DataError(f"StrategyQA answer must be a boolean, got {value!r}", where, line, "answer")
    facts = row.get("facts") or []
    explanation = " ".join(facts) if isinstance(facts, list) else str(facts)
    return str(row["question"]), "yes" if value else "no", explanation.strip()


def normalise_strategyqa(
    rows: Iterable[tuple[int, dict[str, Any], str, str]], test_size: int = STRATEGYQA_TEST_SIZE
) -> list[Record]:
    """rows: (index in its file, row, file for errors, label for the record). Split as documented above."""
    by_text: dict[str, Record] = {}
    for index, row, source, label in rows:
        line = f"record {index}"
        question, answer, explanation = _sqa_fields(row, source, line)
        key = question.strip()
        if not key:
            raise DataError("empty question", source, line, "question")
        rationale = (explanation + " " if explanation else "") + canonical_answer_line("strategyqa", answer)
        record = Record(strategyqa_id(key), "strategyqa", "train", key, answer, rationale, None, f"{label}#{index}")
        earlier = by_text.get(key)
        if earlier is not None and earlier.answer != answer:
            raise DataError(f"question appears twice with different answers ({earlier.source})", source, line, "answer")
        by_text.setdefault(key, record)
    ordered = sorted(by_text.values(), key=lambda r: hashlib.sha256(r.question.encode()).hexdigest())
    if test_size >= len(ordered):
        raise DataError(f"StrategyQA test_size {test_size} leaves no training questions ({len(ordered)} in all)")
    out = []
    for position, record in enumerate(ordered):
        split = "test" if position < test_size else "train"
        out.append(
            Record(
                record.id, record.dataset, split, record.question, record.answer, record.rationale, None, record.source
            )
        )
    return out


# --------------------------------------------------------------------------- MathQA

_LABEL = re.compile(r"\s*,?\s*(?=\b[a-e]\s\)\s?)")
_LETTER_TAIL = re.compile(
    r"(?:the\s+)?(?:correct\s+|right\s+|final\s+)?(?:answer|option|ans|choice)\w*\s*(?:is|will be|should be|would be)?"
    r"\s*[:=\-]?\s*(?:option|choice|answer)?\s*[:\-]?\s*\(?\s*([a-e])\s*\)?\s*[.!]*\s*$",
    re.IGNORECASE,
)


def parse_mathqa_options(options: str, where: str = "", line: int | str | None = None) -> dict[str, str]:
    """Both shapes: "a ) 38 , b ) 27.675 , ..." and the Python-list string "['a ) 4', 'b ) 4 π', ...]"."""
    text = options.strip()
    if text.startswith("["):
        try:
            items = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise DataError(f"options look like a list but do not parse: {options!r}", where, line, "options") from None
        parts = [str(item) for item in items]
    else:
        parts = [p for p in _LABEL.split(text) if p.strip()]
    parsed: dict[str, str] = {}
    for part in parts:
        m = re.match(r"\s*([a-e])\s\)\s?(?:[a-e]\s\)\s?)?(.*)", part.strip())  # doubled labels: "c ) c ) 5"
        if not m:
            raise DataError(f"cannot read option {part!r}", where, line, "options")
        parsed[m.group(1)] = m.group(2).strip().rstrip(",").strip()
    if sorted(parsed) != list(OPTION_LETTERS):
        raise DataError(f"expected options a-e, got {sorted(parsed)} from {options!r}", where, line, "options")
    return {letter: parsed[letter] for letter in OPTION_LETTERS}


_LETTER_FIRST_TAIL = re.compile(
    r"\(?\b([a-e])\)?\s+is\s+the\s+(?:correct\s+|right\s+)?(?:answer|option)\s*[.!]*\s*$", re.I
)
_BARE_LETTER_TAIL = re.compile(r"(?:^|[\s.,;:=])\(?([a-e])\)?(?:\s*[.!])*\s*$", re.IGNORECASE)


def split_mathqa_rationale(rationale: str) -> tuple[str, str | None]:
    """(body, the letter the rationale itself names at its end, or None).

    Real rationales end in many ways: "answer : c .", "correct option : a", "d is the answer",
    "hence , b", or a bare "... = 600 m e". The bare letter is taken only when it stands alone.
    """
    text = rationale.strip().strip('"').strip()
    for pattern in (_LETTER_TAIL, _LETTER_FIRST_TAIL, _BARE_LETTER_TAIL):
        m = pattern.search(text)
        if m:
            return text[: m.start()].strip(), m.group(1).lower()
    return text, None


def normalise_mathqa(
    rows: Iterable[tuple[int, dict[str, Any]]], split: str, source: str, source_split: str, label: str | None = None
) -> list[Record]:
    """rows: (index in the JSON array, row). `source` names the file in errors; `label` goes into each record."""
    label = label or source
    records = []
    for index, (position, row) in enumerate(rows):
        line = f"record {position}"
        for field in ("Problem", "Rationale", "options", "correct"):
            if not isinstance(row.get(field), str) or not row[field].strip():
                raise DataError("missing or empty field", source, line, field)
        correct = row["correct"].strip().lower()
        if correct not in OPTION_LETTERS:
            raise DataError(f"correct must be a letter a-e, got {row['correct']!r}", source, line, "correct")
        options = parse_mathqa_options(row["options"], source, line)
        body, _ = split_mathqa_rationale(row["Rationale"])
        rationale = (body + " " if body else "") + canonical_answer_line("mathqa", correct)
        records.append(
            Record(
                f"mathqa-{split}-{index:05d}",
                "mathqa",
                split,
                row["Problem"].strip(),
                correct,
                rationale,
                options,
                f"{label}#{index} ({source_split})",
            )
        )
    return records


# --------------------------------------------------------------------------- entry points


def _json_array(path: Path) -> list[tuple[int, dict[str, Any]]]:
    data = read_json(path)
    if isinstance(data, dict) and "examples" in data:
        data = data["examples"]
    if not isinstance(data, list) or not data:
        raise DataError("expected a non-empty JSON array of records", path)
    for index, row in enumerate(data):
        if not isinstance(row, dict):
            raise DataError("is not an object", path, f"record {index}")
    return [(index, row) for index, row in enumerate(data)]


def load_local(dataset: str, folder: str | Path, strategyqa_test_size: int = STRATEGYQA_TEST_SIZE) -> list[Record]:
    """Load a data set from a folder holding its original files (names as in the official releases)."""
    check_dataset_name(dataset)
    root = Path(folder)
    if not root.is_dir():
        raise DataError(f"local folder for {dataset} not found", root)
    if dataset == "gsm8k":
        out = []
        for split in ("train", "test"):
            path = root / f"{split}.jsonl"
            out += normalise_gsm8k(read_jsonl(path), split, str(path), path.name)
        return out
    if dataset == "strategyqa":
        official = [root / "train.json", root / "dev.json"]
        if (root / "strategyqa_train.json").is_file():
            official = [root / "strategyqa_train.json"]
        elif not all(p.is_file() for p in official):
            official = [root / "task.json"]  # BIG-bench copy of the same 2290 questions
        rows = [(i, row, str(path), path.name) for path in official for i, row in _json_array(path)]
        return normalise_strategyqa(rows, strategyqa_test_size)
    if list(root.glob("*.parquet")) or list(root.glob("*/*.parquet")):  # the hub parquet conversion, downloaded
        train_files = _parquet_files(root, "train") or _parquet_files(root, "validation")
        source_split = "train" if _parquet_files(root, "train") else "validation"
        test_files = _parquet_files(root, "test")
        out = normalise_mathqa(_parquet_rows(train_files), "train", str(train_files[0]), source_split)
        return out + normalise_mathqa(_parquet_rows(test_files), "test", str(test_files[0]), "test")
    train = root / "train.json"
    source_split = "train"
    if not train.is_file():
        train, source_split = root / "dev.json", "dev"
    out = normalise_mathqa(_json_array(train), "train", str(train), source_split, train.name)
    test = root / "test.json"
    return out + normalise_mathqa(_json_array(test), "test", str(test), "test", test.name)


def _parquet_files(root: Path, split: str) -> list[Path]:
    """`<split>.parquet`, or the hub's shards `<split>-00000-of-00001.parquet` (also in a split folder)."""
    return sorted(
        {*root.glob(f"{split}.parquet"), *root.glob(f"{split}-*.parquet"), *root.glob(f"*/{split}-*.parquet")}
    )


def _parquet_rows(paths: list[Path]) -> list[tuple[int, dict[str, Any]]]:
    import pandas as pd

    if not paths:
        raise DataError("no parquet file for this split (expected <split>.parquet or <split>-*.parquet)")
    rows = []
    for path in paths:
        try:
            frame = pd.read_parquet(path)
        except Exception as err:  # pyarrow raises several types for a damaged file
            raise DataError(f"not a readable parquet file ({err})", path) from None
        rows += frame.to_dict("records")
    return list(enumerate(rows))


HubLoader = Callable[..., Any]


def load_hub(
    dataset: str,
    hub_id: str | None = None,
    hub_config: str | None = None,
    strategyqa_test_size: int = STRATEGYQA_TEST_SIZE,
    load_dataset: HubLoader | None = None,
    revision: str | None = None,
) -> list[Record]:
    """Load by hub id through `datasets.load_dataset` (injectable for tests, which never touch a hub)."""
    check_dataset_name(dataset)
    if load_dataset is None:
        from datasets import load_dataset as hf_load_dataset

        load_dataset = hf_load_dataset
    defaults = HUB_DEFAULTS[dataset]
    hub_id = hub_id or defaults["hub_id"]
    hub_config = hub_config if hub_config is not None else defaults["hub_config"]
    extra = {"revision": revision} if revision else {}
    splits = load_dataset(hub_id, hub_config, **extra) if hub_config else load_dataset(hub_id, **extra)

    def rows(split: str) -> list[tuple[int, dict[str, Any]]]:
        return [(i, dict(row)) for i, row in enumerate(splits[split])]  # i: the row's index in the hub split

    if dataset == "gsm8k":
        return normalise_gsm8k(rows("train"), "train", f"{hub_id}:train") + normalise_gsm8k(
            rows("test"), "test", f"{hub_id}:test"
        )
    if dataset == "strategyqa":  # every labelled split, then our own split
        all_rows = [(i, row, f"{hub_id}:{name}", f"{hub_id}:{name}") for name in splits for i, row in rows(name)]
        return normalise_strategyqa(all_rows, strategyqa_test_size)
    train_split = "train" if "train" in splits else "validation"
    return normalise_mathqa(rows(train_split), "train", f"{hub_id}:{train_split}", train_split) + normalise_mathqa(
        rows("test"), "test", f"{hub_id}:test", "test"
    )


def load_real(dataset: str, settings: dict[str, Any]) -> list[Record]:
    """Load per the config block `data.<dataset>`: `local` folder if set, else the hub id."""
    test_size = int(settings.get("test_size") or STRATEGYQA_TEST_SIZE)
    if settings.get("local"):
        return load_local(dataset, settings["local"], test_size)
    return load_hub(
        dataset, settings.get("hub_id"), settings.get("hub_config"), test_size, revision=settings.get("hub_revision")
    )
