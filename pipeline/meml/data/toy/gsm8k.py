"""Toy GSM8K: multi-step integer word problems with `<<a*b=c>>` calculator notes and `#### N`.

A problem is a start quantity and 1-5 operations; difficulty is the number of operations and
the size of the numbers. The symbolic solution (a list of binary steps) renders three styles:
    E0  the data set's terse rationale, one line a step, calculator notes, "#### N";
    E1  a long forward chain inside <think></think>, every step restated and split into
        tens-and-units sub-steps;
    E2  expression first, then evaluated innermost-first, each step re-checked by its inverse;
        sometimes a slip is made, caught by the check and corrected.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from meml.core.io import DataError
from meml.data.toy.arith import apply, digit_steps, inverse_check, slip

NAMES = ["Mia", "Leo", "Ava", "Noah", "Zoe", "Omar", "Ines", "Ravi", "Lena", "Tom", "Aiko", "Ben"]
ITEMS = [
    ("apples", "bag"),
    ("marbles", "jar"),
    ("stickers", "sheet"),
    ("pencils", "box"),
    ("cards", "pack"),
    ("coins", "purse"),
    ("shells", "bucket"),
    ("eggs", "carton"),
    ("beads", "string"),
    ("books", "crate"),
]
FRIENDS = ["a neighbour", "a classmate", "the teacher", "a friend", "the club", "a cousin"]


@dataclass(frozen=True)
class Step:
    op: str
    a: int
    b: int
    what: str  # what the result is, for prose ("apples in the bags")
    side: bool = False  # a side product (n boxes of m) that the main chain then adds

    @property
    def result(self) -> int:
        return apply(self.op, self.a, self.b)


@dataclass(frozen=True)
class Problem:
    question: str
    start: int
    expression: str  # the whole calculation in one line, as E2 writes it first
    steps: tuple[Step, ...]
    answer: int
    difficulty: int
    person: str
    item: str


def make_problem(rng: random.Random, max_ops: int | None = None) -> Problem:
    """One problem; `max_ops` keeps the first max_ops of the 1-5 operation counts (same weights)."""
    person = rng.choice(NAMES)
    item, container = rng.choice(ITEMS)
    counts = [1, 2, 3, 4, 5][: max_ops or None]
    n_ops = rng.choices(counts, weights=[4, 4, 3, 2, 1][: len(counts)])[0]
    # Mostly small numbers, so that a tiny model can learn the arithmetic facts; a fifth of the
    # problems use larger ones, and long chains grow their numbers: the hard tail.
    big = rng.random() < 0.2
    cur = rng.randint(10, 40) if big else rng.randint(2, 12)
    start = cur
    expr = str(cur)
    sentences = [f"{person} has {cur} {item}."]
    steps: list[Step] = []
    ops_done = 0
    while ops_done < n_ops:
        kind = rng.choice(["groups", "add", "sub", "mul", "div"])
        if kind == "groups":
            n, m = rng.randint(2, 4), rng.randint(2, 9 if big else 5)
            sentences.append(f"Then {person} buys {n} {container}s with {m} {item} in each {container}.")
            steps.append(Step("*", n, m, f"{item} in the {container}s", side=True))
            steps.append(Step("+", cur, n * m, f"{item} after buying"))
            cur += n * m
            expr = f"{_wrap(expr)} + {n} * {m}"
        elif kind == "add":
            x = rng.randint(1, 20 if big else 9)
            sentences.append(f"Then {person} finds {x} more {item}.")
            steps.append(Step("+", cur, x, f"{item} after finding more"))
            cur += x
            expr = f"{_wrap(expr)} + {x}"
        elif kind == "sub":
            if cur < 3:
                continue
            x = rng.randint(1, min(cur - 1, 20 if big else 9))
            sentences.append(f"Then {person} gives {x} {item} to {rng.choice(FRIENDS)}.")
            steps.append(Step("-", cur, x, f"{item} left after giving some away"))
            cur -= x
            expr = f"{_wrap(expr)} - {x}"
        elif kind == "mul":
            k = rng.choice([2, 3])
            if cur * k > (200 if big else 60):
                continue
            sentences.append(f"Then the number of {item} {person} has {'doubles' if k == 2 else 'triples'}.")
            steps.append(Step("*", cur, k, f"{item} after the number {'doubles' if k == 2 else 'triples'}"))
            cur *= k
            expr = f"{_wrap(expr)} * {k}"
        else:
            divisors = [d for d in range(2, 7) if cur % d == 0 and cur // d >= 1]
            if not divisors:
                continue
            d = rng.choice(divisors)
            sentences.append(f"Then {person} shares the {item} equally among {d} friends and keeps nothing.")
            steps.append(Step("/", cur, d, f"{item} each friend gets"))
            cur //= d
            expr = f"{_wrap(expr)} / {d}"
        ops_done += 1
    last = steps[-1]
    question_end = (
        f"How many {item} does each friend get?" if last.op == "/" else f"How many {item} does {person} have now?"
    )
    question = " ".join(sentences) + " " + question_end
    difficulty = len(steps) + (1 if big else 0)
    return Problem(question, start, expr, tuple(steps), cur, difficulty, person, item)


def _wrap(expr: str) -> str:
    return expr if expr.isdigit() else f"({expr})"


def render_e0(p: Problem) -> str:
    lines = [f"The {s.what} are {s.a} {s.op} {s.b} = <<{s.a}{s.op}{s.b}={s.result}>>{s.result}." for s in p.steps]
    return "\n".join(lines) + f"\n#### {p.answer}"


def render_e1(p: Problem) -> str:
    out = [
        "<think>",
        f"Let me read the problem carefully. The count starts at {p.start} {p.item}.",
        f"There are {len(p.steps)} calculations to do, one after another.",
    ]
    for number, s in enumerate(p.steps, start=1):
        out.append(f"Step {number}: I need the {s.what}.")
        out.extend(digit_steps(s.op, s.a, s.b))
        out.append(f"So the {s.what} are {s.result}.")
    out += [
        f"All steps are done and the result is {p.answer}.",
        "</think>",
        f"The count ends at {p.answer}. The answer is {p.answer}.",
        f"#### {p.answer}",
    ]
    return "\n".join(out)


def render_e2(p: Problem, rng: random.Random) -> str:
    # Expression first; the side products (boxes of items) before the main chain; every step
    # re-checked by its inverse; sometimes a slip that the check catches and corrects.
    out = [
        f"First I write the whole calculation as one expression: {p.expression}.",
        "I work out the products inside it first, then go from left to right.",
    ]
    ordered = [s for s in p.steps if s.side] + [s for s in p.steps if not s.side]
    slip_at = rng.randrange(len(ordered)) if rng.random() < 0.3 else -1
    for index, s in enumerate(ordered):
        if index == slip_at:
            wrong = slip(s.result, rng.randrange(5))
            out.append(f"{s.a} {s.op} {s.b} = {wrong}.")
            out.append(
                f"Wait, let me check that: {inverse_check(s.op, s.a, s.b)}, so it should be {s.result}, "
                f"not {wrong}. Correcting: {s.a} {s.op} {s.b} = {s.result}."
            )
        else:
            out.append(f"{s.a} {s.op} {s.b} = {s.result}. Check: {inverse_check(s.op, s.a, s.b)}. Correct.")
    out += [f"Looking back, every step checks out, so the result is {p.answer}.", f"#### {p.answer}"]
    return "\n".join(out)


def generate(rng: random.Random, count: int, max_ops: int | None = None) -> list[tuple[dict[str, str], Problem]]:
    """`count` distinct problems as GSM8K rows ({"question", "answer"}) with their solutions."""
    seen: set[str] = set()
    out: list[tuple[dict[str, str], Problem]] = []
    repeats = 0
    while len(out) < count:
        p = make_problem(rng, max_ops)
        if p.question in seen:
            repeats += 1
            if repeats > 20 * count:  # the generator holds fewer distinct problems than asked for
                message = f"toy GSM8K has about {len(out)} distinct problems here, fewer than the {count} asked for"
                raise DataError(message, None, None, "toy.sizes.gsm8k")
            continue
        seen.add(p.question)
        out.append(({"question": p.question, "answer": render_e0(p)}, p))
    return out
