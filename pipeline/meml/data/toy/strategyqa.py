"""Toy StrategyQA: yes/no questions about invented creatures that need an implicit two- or
three-step decomposition ("Could a glorp and a mivo together outweigh a tasker?").

The facts live in a small closed knowledge base fixed by the seed, so a model can learn them
from the training questions; the test questions combine the same creatures in new ways.
    E0  the data set's own rationale: the facts, then "So the answer is yes.";
    E1  <think>: the question split into numbered sub-questions, answered in order, then compared;
    E2  the criterion first, facts recalled from the last one back, a second check from the
        other side; sometimes a fact recalled wrongly and corrected.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from meml.core.io import DataError

SYLLABLES = [
    "glo",
    "miv",
    "tas",
    "ker",
    "bru",
    "zan",
    "pell",
    "quo",
    "rim",
    "dax",
    "fen",
    "lor",
    "sib",
    "nut",
    "wex",
    "hal",
    "dro",
    "kip",
    "vum",
    "yas",
]
HABITATS = ["forest", "desert", "sea", "mountains", "swamp"]


@dataclass(frozen=True)
class Creature:
    name: str
    legs: int
    weight: int
    habitat: str
    active: str

    def fact(self, attribute: str) -> str:
        return {
            "legs": f"A {self.name} has {self.legs} legs.",
            "weight": f"A {self.name} weighs {self.weight} kg.",
            "habitat": f"A {self.name} lives in the {self.habitat}.",
            "active": f"A {self.name} is awake during the {self.active}.",
        }[attribute]

    def sub_question(self, attribute: str) -> str:
        return {
            "legs": f"How many legs does a {self.name} have?",
            "weight": f"How much does a {self.name} weigh?",
            "habitat": f"Where does a {self.name} live?",
            "active": f"When is a {self.name} awake?",
        }[attribute]


def knowledge_base(rng: random.Random, size: int = 24) -> list[Creature]:
    names: set[str] = set()
    while len(names) < size:
        names.add(rng.choice(SYLLABLES) + rng.choice(SYLLABLES[::-1]))
    return [
        Creature(
            name, rng.choice([0, 2, 4, 6, 8]), rng.randint(1, 300), rng.choice(HABITATS), rng.choice(["day", "night"])
        )
        for name in sorted(names)
    ]


@dataclass(frozen=True)
class Question:
    text: str
    answer: bool
    facts: tuple[tuple[Creature, str], ...]  # (creature, attribute) in the order a forward solver needs them
    comparison: str  # the last step in words, e.g. "6 > 4"
    reverse: str  # the same comparison from the other side, e.g. "4 < 6"
    difficulty: int
    kind: str = ""  # one of KINDS


KINDS = ("legs", "home", "awake", "carry", "two_legs", "outweigh")
PHRASES = {"legs": "more legs than", "home": "near its home", "awake": "awake at the same time",
           "carry": "carry three", "two_legs": "legs in total", "outweigh": "together outweigh"}  # fmt: skip
TRIES = 10_000  # creature draws for a question of a given kind and answer before giving up


def make_question(
    rng: random.Random, kb: list[Creature], kind: str | None = None, answer: bool | None = None
) -> Question:
    """A question of `kind` (default: one drawn at random) about creatures drawn from `kb`; with
    `answer`, creatures are drawn again until the question's answer is that one."""
    kind = kind if kind is not None else rng.choice(KINDS)
    for _ in range(TRIES):
        question = replace(_question(kind, *rng.sample(kb, 3)), kind=kind)
        if answer is None or question.answer == answer:
            return question
    raise DataError(
        f"toy StrategyQA: no '{kind}' question answered {_yn(bool(answer))} among these creatures",
        None, None, "toy.strategyqa_per_kind",
    )  # fmt: skip


def kind_of(question: str) -> str:
    """The kind of a question, from its wording (each kind's wording has a phrase of its own)."""
    found = [kind for kind, phrase in PHRASES.items() if phrase in question]
    if len(found) != 1:
        raise DataError(f"not a toy StrategyQA question: {question!r}")
    return found[0]


def _question(kind: str, a: Creature, b: Creature, c: Creature) -> Question:
    if kind == "legs":
        ans = a.legs > b.legs
        return Question(
            f"Does a {a.name} have more legs than a {b.name}?",
            ans,
            ((a, "legs"), (b, "legs")),
            f"{a.legs} > {b.legs} is {_tf(ans)}",
            f"{b.legs} < {a.legs} is {_tf(ans)}",
            2,
        )
    if kind == "home":
        ans = a.habitat == b.habitat
        return Question(
            f"Could a {a.name} meet a {b.name} near its home?",
            ans,
            ((a, "habitat"), (b, "habitat")),
            f"the {a.habitat} and the {b.habitat} are {'the same place' if ans else 'different places'}",
            f"the {b.habitat} is {'' if ans else 'not '}the {a.habitat}",
            2,
        )
    if kind == "awake":
        ans = a.active == b.active
        return Question(
            f"Would a {a.name} be awake at the same time as a {b.name}?",
            ans,
            ((a, "active"), (b, "active")),
            f"the {a.active} and the {b.active} are {'the same' if ans else 'different'}",
            f"the {b.active} is {'' if ans else 'not '}the {a.active}",
            2,
        )
    if kind == "carry":
        ans = a.weight >= 3 * b.weight
        return Question(
            f"Could a {a.name} carry three {b.name}s if it can carry its own weight?",
            ans,
            ((a, "weight"), (b, "weight")),
            f"3 * {b.weight} = {3 * b.weight}, and {a.weight} >= {3 * b.weight} is {_tf(ans)}",
            f"{3 * b.weight} <= {a.weight} is {_tf(ans)}",
            3,
        )
    if kind == "two_legs":
        ans = 2 * a.legs > b.legs
        return Question(
            f"Do two {a.name}s have more legs in total than a {b.name}?",
            ans,
            ((a, "legs"), (b, "legs")),
            f"2 * {a.legs} = {2 * a.legs}, and {2 * a.legs} > {b.legs} is {_tf(ans)}",
            f"{b.legs} < {2 * a.legs} is {_tf(ans)}",
            3,
        )
    ans = a.weight + b.weight > c.weight
    return Question(
        f"Could a {a.name} and a {b.name} together outweigh a {c.name}?",
        ans,
        ((a, "weight"), (b, "weight"), (c, "weight")),
        f"{a.weight} + {b.weight} = {a.weight + b.weight}, and {a.weight + b.weight} > {c.weight} is {_tf(ans)}",
        f"{c.weight} < {a.weight + b.weight} is {_tf(ans)}",
        4,
    )


def _tf(value: bool) -> str:
    return "true" if value else "false"


def _yn(value: bool) -> str:
    return "yes" if value else "no"


def render_e1(q: Question) -> str:
    out = ["<think>", "This needs some facts I have to recall first. I split the question into sub-questions."]
    for number, (creature, attribute) in enumerate(q.facts, start=1):
        out.append(f"{number}. {creature.sub_question(attribute)} {creature.fact(attribute)}")
    out.append(f"{len(q.facts) + 1}. Now I combine them: {q.comparison}.")
    out += ["</think>", f"So the answer is {_yn(q.answer)}."]
    return "\n".join(out)


def render_e2(q: Question, rng: random.Random) -> str:
    out = ["The question comes down to one comparison. I recall the facts it needs, starting from the last one."]
    facts = list(reversed(q.facts))
    slip_at = rng.randrange(len(facts)) if rng.random() < 0.3 else -1
    for index, (creature, attribute) in enumerate(facts):
        if index == slip_at and attribute in ("legs", "weight"):
            true_value = getattr(creature, attribute)
            wrong = true_value + (2 if attribute == "legs" else 10)
            unit = "legs" if attribute == "legs" else "kg"
            out.append(
                f"A {creature.name} has about {wrong} {unit}... wait, that is not right. {creature.fact(attribute)}"
            )
        else:
            out.append(creature.fact(attribute))
    out.append(f"Comparing: {q.comparison}.")
    out.append(f"Let me double-check from the other side: {q.reverse}. Both agree.")
    out.append(f"So the answer is {_yn(q.answer)}.")
    return "\n".join(out)


def generate(
    rng: random.Random, count: int, kb: list[Creature] | None = None, per_kind: bool = False
) -> tuple[list[tuple[dict[str, object], Question]], list[Creature]]:
    """`count` distinct questions as official-format StrategyQA rows, balanced yes/no, about the
    creatures of `kb` (default: a knowledge base drawn first from `rng`).

    `per_kind`: balanced within each kind of question as well. Why: drawn freely, most kinds lean
    one way ("Could a X meet a Y near its home?" is mostly no: five habitats; "Could a X and a Y
    together outweigh a Z?" mostly yes), so answering each kind's majority answer, without
    recalling a single fact, scores about 70% on the test questions, as much as the toy study's SFT
    models did. Balanced within kinds, the question's wording says nothing about its answer: above
    50% a model must recall the creatures' facts and compare them, a skill RL can reinforce."""
    kb = kb if kb is not None else knowledge_base(rng)
    seen: set[str] = set()
    out: list[tuple[dict[str, object], Question]] = []
    yes = 0
    skipped = 0
    kind_yes = dict.fromkeys(KINDS, 0)
    kind_no = dict.fromkeys(KINDS, 0)
    while len(out) < count:
        if per_kind:  # the kind's scarcer answer (a coin on a tie); the other once that side is full
            kind = rng.choice(KINDS)
            want = kind_yes[kind] < kind_no[kind] or (kind_yes[kind] == kind_no[kind] and rng.random() < 0.5)
            if (want and yes >= (count + 1) // 2) or (not want and len(out) - yes >= count // 2):
                want = not want
            q = make_question(rng, kb, kind, want)
        else:
            q = make_question(rng, kb)
        if q.text in seen or (q.answer and yes >= (count + 1) // 2) or (not q.answer and len(out) - yes >= count // 2):
            skipped += 1
            if skipped > 50 * count:  # the creatures hold fewer distinct questions of one answer than asked for
                message = f"toy StrategyQA has about {len(out)} distinct balanced questions here, fewer than {count}"
                raise DataError(message, None, None, "toy.sizes.strategyqa")
            continue
        seen.add(q.text)
        yes += q.answer
        (kind_yes if q.answer else kind_no)[q.kind] += 1
        row = {
            "qid": f"toy{len(out):05d}",
            "term": q.facts[0][0].name,
            "description": "invented creature",
            "question": q.text,
            "answer": q.answer,
            "facts": [creature.fact(attribute) for creature, attribute in q.facts],
            "decomposition": [creature.sub_question(attribute) for creature, attribute in q.facts] + [q.comparison],
        }
        out.append((row, q))
    return out, kb
