"""Experts 3 and 4 of the toy world, for the number-of-experts study (config `experts.count`).

Both are rewritings of the reference rationale, so they work for all three data sets alike:
    E3  the reference's steps as a numbered list, then the answer line
    E4  the answer stated first, then the steps as a justification, then the answer line
They are distinct surface styles of the same reasoning, as the real teachers are distinct styles
of (mostly) the same solutions.
"""

from __future__ import annotations

import re

from meml.core.answers import canonical_answer_line
from meml.core.records import Record

# Where one step of a reference rationale ends: a line (GSM8K), a sentence (StrategyQA), a
# semicolon (MathQA).
_STEP_SPLIT = {"gsm8k": r"\n", "strategyqa": r"(?<=\.)\s+", "mathqa": r"\s;\s"}


def reference_steps(record: Record) -> list[str]:
    """The reference rationale without its answer line, cut into steps."""
    line = canonical_answer_line(record.dataset, record.answer)
    body = record.rationale.strip()
    if body.endswith(line):
        body = body[: -len(line)].rstrip(" ;\n")
    return [step.strip() for step in re.split(_STEP_SPLIT[record.dataset], body) if step.strip()]


def render_e3(record: Record) -> str:
    numbered = [f"{i}. {step}" for i, step in enumerate(reference_steps(record), start=1)]
    return "\n".join([*numbered, canonical_answer_line(record.dataset, record.answer)])


def render_e4(record: Record) -> str:
    stated = record.answer
    if record.options and record.answer in record.options:
        stated = f"{record.answer} ) {record.options[record.answer]}"
    steps = reference_steps(record)
    why = " Then ".join(steps) if steps else "it follows from the question directly."
    return "\n".join(
        [f"I expect the answer to be {stated}.", f"Why: {why}", canonical_answer_line(record.dataset, record.answer)]
    )
