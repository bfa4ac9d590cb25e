"""How far the answer checker agrees with the real data sets' own gold rationales.

For every record: its gold rationale must be judged correct against its own gold answer, and
wrong against a different question's different gold answer. For MathQA two figures: the letter
the rationale names at its end, and the rationale's final *value* (letter removed) matched to the
options; every value mismatch is written out with a category that explains it.

    python -m meml.cli agreement --datasets ../shared/datasets --out results/agreement
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from meml.core.answers import extract, is_correct, numbers_in, option_value
from meml.core.io import atomic_write_json, atomic_write_jsonl, read_json
from meml.core.records import Record
from meml.data.loaders import load_local, parse_mathqa_options, split_mathqa_rationale


def _other_gold(records: list[Record], i: int) -> str:
    j = (i + 1) % len(records)
    while records[j].answer == records[i].answer:
        j = (j + 1) % len(records)
    return records[j].answer


def agreement_plain(records: list[Record]) -> dict[str, Any]:
    """GSM8K / StrategyQA: own gold accepted, another question's different gold rejected."""
    out: dict[str, Any] = {"records": len(records)}
    for mode in ("strict", "lenient"):
        own = sum(is_correct(r.rationale, r.dataset, r.answer, mode) for r in records)
        other = sum(
            not is_correct(r.rationale, r.dataset, _other_gold(records, i), mode) for i, r in enumerate(records)
        )
        out[mode] = {"own_gold_accepted": own, "other_gold_rejected": other}
    if records and records[0].dataset == "gsm8k":
        # What a "last number in the text" extractor would score without the #### line.
        bodies = [r.rationale.rsplit("####", 1)[0] for r in records]
        out["last_number_without_####"] = sum(
            is_correct(body, "gsm8k", r.answer, "lenient") for body, r in zip(bodies, records, strict=True)
        )
    return out


def _mismatch_reason(body: str, options: dict[str, str], correct: str, predicted: str | None) -> str:
    gold_value = option_value(options[correct])
    values = numbers_in(body)
    if gold_value is None:
        return "correct option is not a number (e.g. 'none of these'); the rationale argues it in words"
    if not values:
        return "rationale has no number to compare"
    if predicted is not None and predicted != correct:
        return "rationale's final number equals another option (noisy or mislabelled rationale)"
    last = values[-1]
    if gold_value and abs(last - gold_value) <= 0.02 * abs(gold_value):
        return "final number is within 2% of the correct option (rounding in the rationale)"
    if any(abs(v - gold_value) <= 1e-6 * max(1.0, abs(gold_value)) for v in values):
        return "correct value appears in the rationale but is not its last number (units, check or trailing text)"
    return "rationale ends on an intermediate or differently scaled value (percent vs fraction, units)"


def agreement_mathqa(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    raw = read_json(path)
    letters: Counter[str] = Counter()
    value_ok = 0
    other_rejected = 0
    mismatches = []
    reasons: Counter[str] = Counter()
    for index, row in enumerate(raw):
        options = parse_mathqa_options(row["options"], str(path), index)
        body, letter = split_mathqa_rationale(row["Rationale"])
        correct = row["correct"]
        letters["no letter at the end" if letter is None else "agrees" if letter == correct else "disagrees"] += 1
        predicted = extract(body, "mathqa", "lenient", options)
        if predicted == correct:
            value_ok += 1
        else:
            reason = _mismatch_reason(body, options, correct, predicted)
            reasons[reason] += 1
            mismatches.append(
                {
                    "file": str(path),
                    "index": index,
                    "correct": correct,
                    "predicted": predicted,
                    "options": options,
                    "rationale_end": body[-160:],
                    "reason": reason,
                }
            )
        wrong_letter = "abcde"[("abcde".index(correct) + 1) % 5]
        full = body + " answer : " + correct
        if not is_correct(full, "mathqa", wrong_letter, "strict", options):
            other_rejected += 1
    summary = {
        "records": len(raw),
        "rationale_letter": dict(letters),
        "final_value_matches_correct_option": value_ok,
        "other_gold_rejected_strict": other_rejected,
        "value_mismatch_reasons": dict(reasons.most_common()),
    }
    return summary, mismatches


def run(datasets_root: str | Path, out_dir: str | Path) -> dict[str, Any]:
    root = Path(datasets_root)
    report: dict[str, Any] = {}
    for name in ("gsm8k", "strategyqa"):
        records = load_local(name, root / name)
        splits = sorted({r.split for r in records})
        report[name] = {split: agreement_plain([r for r in records if r.split == split]) for split in splits}
    report["mathqa"] = {}
    all_mismatches: list[dict[str, Any]] = []
    for split in ("dev", "test"):
        summary, mismatches = agreement_mathqa(root / "mathqa" / f"{split}.json")
        report["mathqa"][split] = summary
        all_mismatches += mismatches
    out = Path(out_dir)
    atomic_write_json(out / "agreement.json", report)
    atomic_write_jsonl(out / "mathqa_value_mismatches.jsonl", all_mismatches)
    return report


def format_report(report: dict[str, Any]) -> str:
    lines = [
        "| data set | split | records | strict: own gold | strict: other gold rejected | lenient: own gold | "
        "lenient: other gold rejected |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in ("gsm8k", "strategyqa"):
        for split, s in report[name].items():
            lines.append(
                f"| {name} | {split} | {s['records']} | {s['strict']['own_gold_accepted']} | "
                f"{s['strict']['other_gold_rejected']} | {s['lenient']['own_gold_accepted']} | "
                f"{s['lenient']['other_gold_rejected']} |"
            )
    g = report["gsm8k"]
    lines.append("")
    lines.append(
        "GSM8K, a last-number extractor on the rationale without its #### line: "
        + ", ".join(f"{k} {v['last_number_without_####']}/{v['records']}" for k, v in g.items())
    )
    lines.append("")
    lines.append(
        "| MathQA split | records | letter at end agrees / disagrees / none | final value matches correct option "
        "| other letter rejected (strict) |"
    )
    lines.append("| --- | --- | --- | --- | --- |")
    for split, s in report["mathqa"].items():
        letter = s["rationale_letter"]
        lines.append(
            f"| {split} | {s['records']} | {letter.get('agrees', 0)} / {letter.get('disagrees', 0)} / "
            f"{letter.get('no letter at the end', 0)} | {s['final_value_matches_correct_option']} | "
            f"{s['other_gold_rejected_strict']} |"
        )
    lines.append("")
    lines.append("MathQA value mismatches by reason (dev + test):")
    merged: Counter[str] = Counter()
    for s in report["mathqa"].values():
        merged.update(s["value_mismatch_reasons"])
    for reason, count in merged.most_common():
        lines.append(f"- {count}: {reason}")
    return "\n".join(lines)
