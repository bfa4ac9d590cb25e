"""The answer checker: the single module that is both the RL reward and the evaluation scorer.

Each data set has one canonical answer line, the one our trajectories end with:
    gsm8k       "#### 18"                  (GSM8K's own format)
    strategyqa  "So the answer is yes."    (the chain-of-thought convention for StrategyQA)
    mathqa      "answer : c"               (MathQA's own rationale ending)

Two modes:
    strict   only the canonical line counts (its last occurrence);
    lenient  also "The answer is N", \\boxed{N}, "Answer: c", "(c)", true/false, an option's value
             instead of its letter, and as a last resort the last number / yes-no word in the text.

`extract` returns the normalised prediction (a number string, "yes"/"no" or a letter) or None;
`is_correct` compares it with the gold; `reward` adds the optional format bonus.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

MODES = ("strict", "lenient")

# --------------------------------------------------------------------------- numbers

_MINUS = "\u2212\u2013"  # unicode minus and en dash, both seen in model outputs
# `int` may be empty before a fraction: ".5" and "-.25" are numbers as models write them.
_NUMBER = re.compile(
    r"(?<![\w.])(?P<sign>-\s?)?\$?\s?(?P<int>\d{1,3}(?:,\d{3})+|\d+|(?=\.\d))(?P<frac>\.\d+)?(?!\d)"
    r"(?:\s*/\s*(?P<den>\d+)(?![\d.]))?"
)


def _clean_number_text(text: str) -> str:
    for ch in _MINUS:
        text = text.replace(ch, "-")
    # MathQA's tokeniser splits thousands groups: "2 , 261,760" is 2,261,760.
    text = re.sub(r"(?<=\d) , (?=\d{3}\b)", ",", text)
    return text


def _match_value(m: re.Match[str]) -> float:
    value = float((m.group("int").replace(",", "") or "0") + (m.group("frac") or ""))
    if m.group("den"):
        den = int(m.group("den"))
        value = value / den if den else math.nan
    return -value if m.group("sign") else value


def numbers_in(text: str) -> list[float]:
    """Every number in the text, in order; commas, $, signs, decimals and a/b fractions handled.
    Runaway digit strings that overflow a float (a degenerate sample) are skipped."""
    return [v for v in (_match_value(m) for m in _NUMBER.finditer(_clean_number_text(text))) if math.isfinite(v)]


def parse_number(text: str) -> float | None:
    """The value of a short answer string ("$1,450,000.", "-10", "13 1 / 2", "4 π"), or None."""
    text = _clean_number_text(text.strip())
    mixed = re.fullmatch(r"\s*(-\s?)?(\d+)\s+(\d+)\s*/\s*(\d+)\s*(.*)", text)
    if mixed and int(mixed.group(4)) and not re.search(r"\d", mixed.group(5)):
        value = float(mixed.group(2)) + float(mixed.group(3)) / float(mixed.group(4))
        if not math.isfinite(value):
            return None
        return -value if mixed.group(1) else value
    matches = list(_NUMBER.finditer(text))
    if not matches:
        return None
    value = _match_value(matches[0])
    if not math.isfinite(value):
        return None
    if "\u03c0" in text[matches[0].end() : matches[0].end() + 3]:
        value *= math.pi
    return value if math.isfinite(value) else None


def format_number(value: float) -> str:
    """Canonical string of a number: integers without a decimal point, others up to 6 places."""
    if abs(value - round(value)) < 1e-9:
        return str(round(value))
    return f"{value:.6f}".rstrip("0").rstrip(".")


def numbers_equal(a: float, b: float) -> bool:
    """Equal up to a relative 1e-6: for values that were rounded on purpose (MathQA option values,
    non-integer golds written to a few places), never for an integer gold (see `answer_equals`)."""
    return abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b))


def answer_equals(prediction: float, gold: float) -> bool:
    """An integer gold is compared exactly (1000001 is not 1000000, and GSM8K has golds of
    192,000,000, where a relative tolerance would accept +-192); a non-integer gold with
    `numbers_equal`'s tolerance, since it was rounded when written."""
    if gold == round(gold):
        return prediction == gold
    return numbers_equal(prediction, gold)


# --------------------------------------------------------------------------- helpers


def _last(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    found = None
    for found in pattern.finditer(text):  # noqa: B007 - keep the last one
        pass
    return found


def _boxed_contents(text: str) -> list[str]:
    """Contents of every \\boxed{...}, braces balanced."""
    out = []
    for m in re.finditer(r"\\boxed\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            out.append(text[m.end() : i - 1])
    return out


_math_verify_quiet = False


def _latex_value(latex: str) -> float | None:
    """Value of a LaTeX answer such as \\frac{3}{4} via math-verify (timeouts off: thread-safe)."""
    global _math_verify_quiet
    try:
        from math_verify import parse
    except ImportError:  # pragma: no cover - math-verify is a pinned dependency
        return None
    if not _math_verify_quiet:
        logging.getLogger("math_verify").setLevel(logging.ERROR)
        _math_verify_quiet = True
    try:
        parsed = parse("$" + latex + "$", parsing_timeout=None)  # type: ignore[arg-type]
        for item in parsed:
            if hasattr(item, "is_number") and item.is_number:
                value = float(item)
                return value if math.isfinite(value) else None
    except Exception:  # math-verify raises on some malformed LaTeX; treat as no answer
        return None
    return None


# --------------------------------------------------------------------------- GSM8K

# The tail of a statement ends where the line ends or the next statement of the same kind starts,
# so "The answer is 12. So the answer is 15." yields two statements and the last one counts.
_ANSWER_WORDS = r"(?:final answer|answer)\s*(?:is|:|=)"
_GSM_STRICT = re.compile(r"####\s*((?:(?!####)[^\n])*)")
_ANSWER_IS = re.compile(_ANSWER_WORDS + r"\s*:?\s*((?:(?!" + _ANSWER_WORDS + r")[^\n])*)", re.IGNORECASE)


def _extract_gsm8k(text: str, mode: str) -> str | None:
    m = _last(_GSM_STRICT, text)
    if m:
        value = parse_number(m.group(1))
        if value is not None or mode == "strict":
            return format_number(value) if value is not None else None
    if mode == "strict":
        return None
    for content in reversed(_boxed_contents(text)):
        value = parse_number(content) if not re.search(r"\\[a-z]", content) else None
        if value is None:
            value = _latex_value(content)
        if value is not None:
            return format_number(value)
    m = _last(_ANSWER_IS, text)
    if m:
        value = parse_number(m.group(1))
        if value is not None:
            return format_number(value)
    values = numbers_in(text)
    return format_number(values[-1]) if values else None


# --------------------------------------------------------------------------- StrategyQA

_YN = {"yes": "yes", "no": "no", "true": "yes", "false": "no"}
_SQA_STRICT = re.compile(r"answer is:?\s*\**\s*(yes|no)\b", re.IGNORECASE)
_SQA_LENIENT = [
    re.compile(r"####\s*\**\s*(yes|no|true|false)\b", re.IGNORECASE),
    re.compile(r"\\boxed\s*\{\s*(?:\\text\s*\{)?\s*(yes|no|true|false)\b", re.IGNORECASE),
    re.compile(r"answer\s*(?:is|:)\s*:?\s*\**\s*(yes|no|true|false)\b", re.IGNORECASE),
]
_SQA_START = re.compile(r"^\W*(yes|no|true|false)\b", re.IGNORECASE)
_SQA_ANY = re.compile(r"\b(yes|no|true|false)\b", re.IGNORECASE)


def _extract_strategyqa(text: str, mode: str) -> str | None:
    m = _last(_SQA_STRICT, text)
    if m:
        return m.group(1).lower()
    if mode == "strict":
        return None
    for pattern in _SQA_LENIENT:
        m = _last(pattern, text)
        if m:
            return _YN[m.group(1).lower()]
    m = _SQA_START.match(text)
    if m:
        return _YN[m.group(1).lower()]
    m = _last(_SQA_ANY, text)
    return _YN[m.group(1).lower()] if m else None


# --------------------------------------------------------------------------- MathQA

_MQA_STRICT = re.compile(r"answer\s*:\s*\(?([a-e])\)?(?![\w])", re.IGNORECASE)
_LETTER_END = r"(?=\s*(?:[.,;:!)]|\*|$))"  # a letter must close its phrase: "answer is a 20% rise" is no letter
_MQA_LETTER = [
    re.compile(r"\\boxed\s*\{\s*\(?([a-e])\)?\s*\}", re.IGNORECASE),
    re.compile(r"answer\s*(?:is|:)?\s*:?\s*(?:option\s*)?\(?([a-e])\)?" + _LETTER_END, re.IGNORECASE | re.MULTILINE),
    re.compile(r"\boption\s*:?\s*\(?([a-e])\)?" + _LETTER_END, re.IGNORECASE | re.MULTILINE),
]


def option_value(text: str) -> float | None:
    """Numeric value of a MathQA option text, or None for 'none of these', roots and the like."""
    if "\u221a" in text or not re.search(r"\d", text):
        return None
    ratio = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*:\s*(\d+(?:\.\d+)?)\s*", text)
    if ratio:
        den = float(ratio.group(2))
        return float(ratio.group(1)) / den if den else None
    return parse_number(text)


def _decimals(text: str) -> int:
    m = re.search(r"\d\.(\d+)", text)
    return len(m.group(1)) if m else 0


def _normalise_text(text: str) -> str:
    return re.sub(r"[^a-z0-9\u03c0]+", " ", text.lower()).strip()


def letter_for_value(value: float, options: Mapping[str, str]) -> str | None:
    """The option whose value equals `value`; failing that, one with decimals that `value` rounds to
    (6.55 -> "6.6 kmph"). Integer options are never matched by rounding: 6.5 is not "6 %"."""
    values = {letter: option_value(text) for letter, text in options.items()}
    for letter, v in values.items():
        if v is not None and numbers_equal(value, v):
            return letter
    for letter, v in values.items():
        places = _decimals(options[letter])
        if v is not None and places and abs(value - v) <= 0.5 * 10**-places + 1e-9:
            return letter
    return None


def _extract_mathqa(text: str, mode: str, options: Mapping[str, str] | None) -> str | None:
    m = _last(_MQA_STRICT, text)
    if m:
        return m.group(1).lower()
    if mode == "strict":
        return None
    for pattern in _MQA_LETTER:
        m = _last(pattern, text)
        if m:
            return m.group(1).lower()
    if not options:
        return None
    # The model wrote the option's value instead of its letter.
    # The model wrote the option's value instead of its letter: the value after the last
    # "answer is", else the last number in the text.
    tail_match = _last(_ANSWER_IS, text)
    tail = tail_match.group(1) if tail_match else (text.strip().splitlines() or [""])[-1]
    for letter, opt in options.items():
        if option_value(opt) is None and _normalise_text(opt) and _normalise_text(opt) in _normalise_text(tail):
            return letter
    candidates = [parse_number(tail), _final_value(tail)] if tail_match else []
    for value in [*candidates, _final_value(text)]:
        found = letter_for_value(value, options) if value is not None else None
        if found is not None:
            return found
    return None


_RATIO_END = re.compile(r"(-?\d+(?:\.\d+)?)\s*:\s*(\d+(?:\.\d+)?)\s*\W*$")
_PI_END = re.compile(r"(-?\d+(?:\.\d+)?)\s*(?:\u03c0|pi)\b[^\d]*$", re.IGNORECASE)


def _final_value(text: str) -> float | None:
    """The value a worked solution ends on: a trailing ratio "9 : 4", a multiple of pi, or the last number."""
    text = _clean_number_text(text.strip())
    m = _RATIO_END.search(text)
    if m and float(m.group(2)):
        return float(m.group(1)) / float(m.group(2))
    m = _PI_END.search(text)
    if m:
        return float(m.group(1)) * math.pi
    values = numbers_in(text)
    return values[-1] if values else None


# --------------------------------------------------------------------------- public API


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown checking mode '{mode}'; known: {', '.join(MODES)}")


def extract(text: str, dataset: str, mode: str = "lenient", options: Mapping[str, str] | None = None) -> str | None:
    """The normalised answer that `text` gives for a question of `dataset`, or None."""
    _check_mode(mode)
    if dataset == "gsm8k":
        return _extract_gsm8k(text, mode)
    if dataset == "strategyqa":
        return _extract_strategyqa(text, mode)
    if dataset == "mathqa":
        return _extract_mathqa(text, mode, options)
    raise ValueError(f"unknown data set '{dataset}'")


def answers_match(prediction: str | None, gold: str, dataset: str) -> bool:
    if prediction is None:
        return False
    if dataset == "gsm8k":
        p, g = parse_number(prediction), parse_number(gold)
        return p is not None and g is not None and answer_equals(p, g)
    return prediction.strip().lower() == gold.strip().lower()


def is_correct(
    text: str,
    dataset: str,
    gold: str,
    mode: str = "lenient",
    options: Mapping[str, str] | None = None,
    finished: bool = True,
) -> bool:
    """Whether the answer is right. An answer cut at the token cap (`finished` False) is wrong: the
    lenient checker would otherwise take the last number of a half-written chain as its answer."""
    return finished and answers_match(extract(text, dataset, mode, options), gold, dataset)


def canonical_answer_line(dataset: str, answer: str) -> str:
    """The line every trajectory ends with; `extract(..., mode='strict')` reads it back."""
    if dataset == "gsm8k":
        return f"#### {answer}"
    if dataset == "strategyqa":
        return f"So the answer is {answer}."
    if dataset == "mathqa":
        return f"answer : {answer}"
    raise ValueError(f"unknown data set '{dataset}'")


def has_canonical_format(text: str, dataset: str) -> bool:
    """True when the text ends its reasoning with the canonical answer line (the format reward)."""
    return extract(text, dataset, "strict") is not None


@dataclass(frozen=True)
class RewardConfig:
    mode: str = "lenient"
    format_bonus: float = 0.0  # added when the canonical answer line is present (optional format reward)


def score(
    text: str,
    dataset: str,
    gold: str,
    options: Mapping[str, str] | None = None,
    config: RewardConfig | None = None,
    finished: bool = True,
) -> tuple[bool, float]:
    """(is it correct, its reward): 1 for a correct answer, 0 otherwise, plus `format_bonus` when the
    canonical line is present. The RL loop needs both; one extraction serves them. An answer cut at
    the token cap (`finished` False) is wrong (is_correct) and earns nothing, bonus included."""
    config = config or RewardConfig()
    if not finished:
        return False, 0.0
    correct = is_correct(text, dataset, gold, config.mode, options)
    value = float(correct)
    if config.format_bonus and has_canonical_format(text, dataset):
        value += config.format_bonus
    return correct, value


def reward(
    text: str, dataset: str, gold: str, options: Mapping[str, str] | None = None, config: RewardConfig | None = None
) -> float:
    return score(text, dataset, gold, options, config)[1]
