"""Arithmetic written out at three granularities, shared by the toy generators' expert styles."""

from __future__ import annotations


def apply(op: str, a: int, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if b == 0 or a % b:
        raise ValueError(f"{a} / {b} is not an exact integer division")
    return a // b


def digit_steps(op: str, a: int, b: int) -> list[str]:
    """Fine-grained sub-steps in the manner of a long chain of thought: split the second operand
    into tens and units ("47 + 28 = 47 + 20 + 8 = 67 + 8 = 75")."""
    c = apply(op, a, b)
    tens, units = divmod(b, 10)
    if op in "+-" and tens and units:
        mid = apply(op, a, tens * 10)
        return [
            f"{a} {op} {b} = {a} {op} {tens * 10} {op} {units}",
            f"{a} {op} {tens * 10} = {mid}",
            f"{mid} {op} {units} = {c}",
        ]
    if op == "*" and a >= 10 and b < 10:
        at, au = divmod(a, 10)
        if au:
            return [
                f"{a} * {b} = {at * 10} * {b} + {au} * {b}",
                f"{at * 10} * {b} = {at * 10 * b}",
                f"{au} * {b} = {au * b}",
                f"{at * 10 * b} + {au * b} = {c}",
            ]
    if op == "/":
        return [f"{a} / {b}: {b} * {c} = {a}, so {a} / {b} = {c}"]
    return [f"{a} {op} {b} = {c}"]


def slip(value: int, rng_value: int) -> int:
    """A plausible wrong result (off by one, ten or a digit), never equal to the right one."""
    delta = (1, 10, 2, -1, -10)[rng_value % 5]
    wrong = value + delta
    return wrong if wrong != value else value + 1


def inverse_check(op: str, a: int, b: int) -> str:
    """Re-check a step by its inverse operation, as a reflective solver does."""
    c = apply(op, a, b)
    if op == "+":
        return f"{c} - {b} = {a}"
    if op == "-":
        return f"{c} + {b} = {a}"
    if op == "*":
        return f"{c} / {b} = {a}" if b else f"{a} * 0 = 0"
    return f"{c} * {b} = {a}"
