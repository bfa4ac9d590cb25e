"""Toy MathQA: lower-cased, space-tokenised word problems with five options in MathQA's
"a ) 38 , b ) 27.675 , ..." format and a letter answer.

Each template computes its value along two different routes:
    E0  the data set's terse rationale ("... = 40 answer : c");
    E1  <think>: the givens listed, the formula applied one operation at a time, then every
        option compared with the value in turn;
    E2  a different order of operations (e.g. interest per year first), the value checked by
        substituting it back, sometimes a slip corrected, then the option picked.
Distractors are the values of typical mistakes, so a wrong route lands on a real option.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from meml.core.answers import format_number
from meml.core.io import DataError


@dataclass(frozen=True)
class Problem:
    text: str
    value: float
    unit: str
    category: str
    forward: tuple[str, ...]  # E0 / E1 route, one operation a line
    other_route: tuple[str, ...]  # E2 route
    check: str  # substituting the value back
    distractors: tuple[float, ...]
    difficulty: int
    formula: str


def _f(x: float) -> str:
    return format_number(x)


def make_problem(rng: random.Random, small: bool = False) -> Problem:
    """One problem of a family drawn at random. `small`: the numbers of each family shrunk to small
    facts with zeros appended (at most three significant digits; toy.mathqa_small), the range the
    tiny models' arithmetic reaches; the default draws are untouched by it."""
    kind = rng.choice(["percent", "speed", "interest", "share", "gain", "work", "average"])
    if kind == "percent":
        if small:
            p, n = rng.choice([10, 20, 50]), rng.randint(1, 9) * rng.choice([10, 100])
        else:
            p, n = rng.choice([5, 10, 20, 25, 50, 15]), rng.randint(2, 40) * 20
        v = n * p / 100
        return Problem(
            f"what is {p} % of {n} ?",
            v,
            "",
            "general",
            (f"{p} % of {n} = {n} * {p} / 100", f"{n} * {p} = {n * p}", f"{n * p} / 100 = {_f(v)}"),
            (f"1 % of {n} = {n} / 100 = {_f(n / 100)}", f"{p} % = {p} * {_f(n / 100)} = {_f(v)}"),
            f"{_f(v)} / {n} * 100 = {p} %",
            (n * p / 10, v + p, n / p, v * 2),
            1,
            f"multiply({n},divide({p},const_100))",
        )
    if kind == "speed":
        t = rng.randint(2, 9)
        s = rng.randint(2, 9) * rng.choice([1, 10]) if small else rng.randint(3, 30) * 5
        d = s * t
        return Problem(
            f"a car covers {d} km in {t} hours . what is its speed in kmph ?",
            s,
            " kmph",
            "physics",
            (f"speed = distance / time = {d} / {t}", f"{d} / {t} = {s}"),
            (f"in one hour the car covers {d} / {t} km", f"{t} * {s} = {d} so one hour is {s} km"),
            f"{s} * {t} = {d} km",
            (d * t, s + 5, s - 5, d / (t + 1)),
            1,
            f"divide({d},{t})",
        )
    if kind == "interest":
        if small:
            principal, r, years = rng.randint(1, 9) * 100, rng.choice([2, 5, 10]), rng.randint(2, 5)
        else:
            principal, r, years = rng.randint(2, 30) * 100, rng.choice([2, 4, 5, 8, 10, 12]), rng.randint(2, 6)
        v = principal * r * years / 100
        return Problem(
            f"what is the simple interest on rs . {principal} at {r} % per annum for {years} years ?",
            v,
            "",
            "gain",
            (
                f"s . i . = ( p * r * t ) / 100 = ( {principal} * {r} * {years} ) / 100",
                f"{principal} * {r} = {principal * r}",
                f"{principal * r} * {years} = {principal * r * years}",
                f"{principal * r * years} / 100 = {_f(v)}",
            ),
            (
                f"interest for one year = {principal} * {r} / 100 = {_f(principal * r / 100)}",
                f"for {years} years = {_f(principal * r / 100)} * {years} = {_f(v)}",
            ),
            f"{_f(v)} / {years} = {_f(v / years)} a year , and {_f(v / years)} / {principal} = {r} %",
            (principal * r / 100, v + principal, v * 2, principal * r * (years + 1) / 100),
            2,
            f"divide(multiply(multiply({principal},{r}),{years}),const_100)",
        )
    if kind == "share":
        x, y = rng.sample([1, 2, 3, 4, 5] if small else [1, 2, 3, 4, 5, 7], 2)
        n = (x + y) * (rng.randint(2, 9) * rng.choice([1, 10]) if small else rng.randint(5, 60) * 10)
        v = n * y / (x + y)
        return Problem(
            f"rs . {n} is divided between a and b in the ratio {x} : {y} . what is b ' s share ?",
            v,
            "",
            "other",
            (
                f"total parts = {x} + {y} = {x + y}",
                f"one part = {n} / {x + y} = {_f(n / (x + y))}",
                f"b ' s share = {y} * {_f(n / (x + y))} = {_f(v)}",
            ),
            (f"b gets {y} / {x + y} of the total", f"{n} * {y} = {n * y}", f"{n * y} / {x + y} = {_f(v)}"),
            f"a gets {_f(n - v)} and {_f(n - v)} + {_f(v)} = {n}",
            (n * x / (x + y), n / y, v + n / (x + y), n - v / 2),
            2,
            f"divide(multiply({n},{y}),add({x},{y}))",
        )
    if kind == "gain":
        cost = rng.randint(1, 9) * rng.choice([10, 100]) if small else rng.randint(2, 20) * 50
        pct = rng.choice([10, 20, 50]) if small else rng.choice([10, 20, 25, 40, 50, 5])
        sell = cost * (100 + pct) // 100
        return Problem(
            f"a man buys an article for rs . {cost} and sells it for rs . {sell} . find the gain percent .",
            pct,
            " %",
            "gain",
            (f"gain = {sell} - {cost} = {sell - cost}", f"gain % = {sell - cost} / {cost} * 100 = {pct}"),
            (
                f"selling price / cost price = {sell} / {cost} = {_f(sell / cost)}",
                f"{_f(sell / cost)} - 1 = {_f(sell / cost - 1)} , which is {pct} %",
            ),
            f"{cost} + {pct} % of {cost} = {cost} + {_f(cost * pct / 100)} = {sell}",
            ((sell - cost) / sell * 100, pct * 2, sell - cost, pct + 5),
            2,
            f"multiply(divide(subtract({sell},{cost}),{cost}),const_100)",
        )
    if kind == "work":
        a, b = rng.choice(
            [(6, 3), (4, 4), (3, 6), (2, 2), (6, 6), (4, 12)]
            if small
            else [
                (6, 3),
                (12, 6),
                (10, 15),
                (20, 30),
                (12, 4),
                (24, 12),
                (18, 9),
                (40, 10),
                (30, 15),
                (36, 12),
                (28, 21),
                (14, 35),
            ]
        )
        v = a * b / (a + b)
        return Problem(
            f"a can finish a work in {a} days and b in {b} days . in how many days will they finish it together ?",
            v,
            " days",
            "physics",
            (
                f"a ' s one day work = 1 / {a} , b ' s one day work = 1 / {b}",
                f"together = 1 / {a} + 1 / {b} = {a + b} / {a * b}",
                f"days = {a * b} / {a + b} = {_f(v)}",
            ),
            (
                f"product of the days = {a} * {b} = {a * b}",
                f"sum of the days = {a} + {b} = {a + b}",
                f"together = {a * b} / {a + b} = {_f(v)}",
            ),
            f"in {_f(v)} days a does {_f(v)} / {a} and b does {_f(v)} / {b} , which add up to 1",
            ((a + b) / 2, a + b, abs(a - b), v + 1),
            3,
            f"divide(multiply({a},{b}),add({a},{b}))",
        )
    k = rng.randint(3, 6) if small else rng.randint(3, 8)
    rest = rng.randint(2, 20) if small else rng.randint(5, 40)
    x = rng.randint(1, 9) if small else rng.randint(1, 60)
    m_total = rest * (k - 1) + x
    while m_total % k:
        x += 1
        m_total = rest * (k - 1) + x
    m = m_total // k
    return Problem(
        f"the average of {k} numbers is {m} . if the number {x} is removed , what is the average of the "
        f"remaining numbers ?",
        rest,
        "",
        "general",
        (
            f"sum of {k} numbers = {k} * {m} = {k * m}",
            f"after removing {x} : {k * m} - {x} = {k * m - x}",
            f"average = {k * m - x} / {k - 1} = {rest}",
        ),
        (
            f"removing {x} changes the sum by {x} and the count by 1",
            f"new sum = {k * m} - {x} = {k * m - x}",
            f"{k * m - x} / {k - 1} = {rest}",
        ),
        f"{rest} * {k - 1} + {x} = {k * m} = {k} * {m}",
        ((k * m - x) / k, m - x / k, rest + 1, m),
        3,
        f"divide(subtract(multiply({k},{m}),{x}),subtract({k},const_1))",
    )


def options_for(rng: random.Random, p: Problem) -> tuple[dict[str, str], str]:
    values = [p.value]
    for d in list(p.distractors) + [p.value + s for s in (1, -1, 2, 3, 10, -2)] + [p.value * 1.5]:
        d = round(d, 3)
        if d > 0 and all(abs(d - v) > 1e-9 for v in values):
            values.append(d)
        if len(values) == 5:
            break
    order = list(range(5))
    rng.shuffle(order)
    letters = "abcde"
    options = {letters[i]: _f(values[order[i]]) + p.unit for i in range(5)}
    correct = letters[order.index(0)]
    return options, correct


def render_e0(p: Problem, correct: str) -> str:
    return " ; ".join(p.forward) + f" ; answer : {correct}"


def render_e1(p: Problem, options: dict[str, str], correct: str) -> str:
    out = ["<think>", f"the question asks : {p.text}", "i apply the formula one operation at a time ."]
    out += [f"step {i} : {line}" for i, line in enumerate(p.forward, start=1)]
    out.append(f"so the value is {_f(p.value)}{p.unit} . now i compare it with every option .")
    for letter, text in options.items():
        out.append(f"{letter} ) {text} : {'this matches' if letter == correct else 'no'}")
    out += ["</think>", f"the value {_f(p.value)}{p.unit} is option {correct} .", f"answer : {correct}"]
    return "\n".join(out)


def render_e2(p: Problem, options: dict[str, str], correct: str, rng: random.Random) -> str:
    out = ["let me take a different route to the value ."]
    route = list(p.other_route)
    if rng.random() < 0.3:
        wrong = _f(p.value + 1)
        out += route[:-1]
        out.append(route[-1].rsplit("=", 1)[0] + f"= {wrong}")
        out.append(f"hmm , that does not look right . recomputing : {route[-1]}")
    else:
        out += route
    out.append(f"check by putting it back : {p.check} , so {_f(p.value)}{p.unit} is right .")
    out.append(f"the option with {options[correct]} is {correct} .")
    out.append(f"answer : {correct}")
    return "\n".join(out)


def generate(
    rng: random.Random, count: int, small: bool = False
) -> list[tuple[dict[str, str], Problem, dict[str, str], str]]:
    """`count` distinct problems as MathQA rows, with solution, options and correct letter."""
    seen: set[str] = set()
    out: list[tuple[dict[str, str], Problem, dict[str, str], str]] = []
    repeats = 0
    while len(out) < count:
        p = make_problem(rng, small)
        if p.text in seen:
            repeats += 1
            if repeats > 20 * count:  # the families hold fewer distinct problems than asked for
                kind = " with small numbers" if small else ""
                message = f"toy MathQA has about {len(out)} distinct problems{kind}, fewer than the {count} asked for"
                raise DataError(message, None, None, "toy.sizes.mathqa")
            continue
        seen.add(p.text)
        options, correct = options_for(rng, p)
        row = {
            "Problem": p.text,
            "Rationale": f'"{render_e0(p, correct)}"',
            "options": " , ".join(f"{k} ) {v}" for k, v in options.items()),
            "correct": correct,
            "annotated_formula": p.formula,
            "linear_formula": p.formula,
            "category": p.category,
        }
        out.append((row, p, options, correct))
    return out
