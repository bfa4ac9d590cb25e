"""The base model before any training (`eval.base`): its zero-shot accuracy per data set and expert
prompt with a 95% interval, beside the chance level and the model's own published figure; and a
sample of its raw responses beside what the answer checker extracted from them.

A real model's base row is the first number that says whether the evaluator reads the model: an
accuracy far under a published figure, or a checker that extracts nothing from answers a reader
can see, shows up here before any GPU time is spent. The evaluation files are
results/<profile>/eval/<model>/<ds>/base.json (the evaluate_base rule).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from meml.core.answers import answers_match
from meml.core.io import DataError, read_json
from meml.data.experts import prompts_of
from meml.plan import grid
from meml.plan.layout import Layout
from meml.reporting.results import cut_note
from meml.reporting.tables import DATASET_TITLES, MISSING, Table

CHANCE_NOTE = {
    "gsm8k": "0 (an open number)",
    "strategyqa": "the larger answer class's share of these questions",
    "mathqa": "20 (five options)",
}


def wilson(correct: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95% by default), in [0, 1]; (0, 1) for n = 0.
    Unlike the normal interval it stays inside [0, 1] and is not empty at 0 or n correct."""
    if n <= 0:
        return 0.0, 1.0
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def chance_level(dataset: str, golds: list[str]) -> float:
    """In %: 0 on GSM8K, 20 on MathQA, the majority answer's share on StrategyQA (yes/no)."""
    if dataset == "gsm8k":
        return 0.0
    if dataset == "mathqa":
        return 20.0
    return 100 * max(golds.count(g) for g in set(golds)) / len(golds) if golds else 50.0


def _accuracy_cells(correct: int, n: int) -> list[str]:
    lo, hi = wilson(correct, n)
    return [f"{100 * correct / n:.1f}" if n else MISSING, f"{100 * lo:.1f} – {100 * hi:.1f}", f"{correct} / {n}"]


def base_table(cfg: dict[str, Any], root: str | Path) -> Table:
    mode = cfg["reward"]["mode"]
    table = Table(
        "base",
        f"The base model before training: zero-shot accuracy under each expert's prompt ({mode} checker)",
        ["model", "data set", "prompt"],
        [("accuracy %", ["ours", "95% CI", "correct"]), ("", ["finished %", "chance %", "published %"])],
    )
    notes = []
    reports = []
    for model in grid.models(cfg):
        entry = cfg["models"][model]
        published = entry.get("published") or {}
        for ds in cfg["grid"]["datasets"]:
            path = Layout(Path(root)).eval_base(model, ds)
            if not path.is_file():
                raise DataError("no base evaluation (eval.base: true writes it)", path)
            report = read_json(path)["model"]
            reports.append(report)
            samples = report["samples"]
            chance = f"{chance_level(ds, [str(q['gold']) for q in samples]):.1f}"
            figure = published.get(ds)
            shown = MISSING if figure is None else f"{float(figure):.1f}"
            for name in sorted(report["experts"]):
                correct = sum(bool(q[name][f"{mode}_correct"]) for q in samples if name in q)
                finished = f"{100 * report['experts'][name]['finished']:.0f}"
                label = f"expert {name[1:]}"
                table.add(
                    [model, DATASET_TITLES[ds], label],
                    [*_accuracy_cells(correct, len(samples)), finished, chance, shown],
                )
            if "majority_vote" in report:
                votes = [q.get(f"majority_vote_{mode}") for q in samples]
                correct = sum(answers_match(v, q["gold"], ds) for v, q in zip(votes, samples, strict=True))
                table.add(
                    [model, DATASET_TITLES[ds], "majority vote"],
                    [*_accuracy_cells(correct, len(samples)), MISSING, chance, shown],
                )
        if entry.get("published_note"):
            notes.append(f"published % ({model}): {entry['published_note']}")
    table.notes = [
        "The model as the config gives it, before SFT or RL, greedy, the same lm-eval task, questions and "
        "length cap as the cells. 95% CI: Wilson score interval over the test questions. finished %: answers "
        "that ended within the length cap.",
        cut_note(reports, mode, trained=False),
        "chance %: " + "; ".join(f"{DATASET_TITLES[ds]} {CHANCE_NOTE[ds]}" for ds in cfg["grid"]["datasets"]) + ".",
        *notes,
    ]
    return table


def _cell_text(text: Any, limit: int) -> str:
    """A response as one Markdown table cell: newlines shown as ⏎, pipes escaped, the end kept
    (the answer line is at the end)."""
    if text is None:
        return MISSING
    s = str(text).replace("\r", "").replace("\n", " ⏎ ").replace("|", "\\|")
    return s if len(s) <= limit else "…" + s[-limit:]


def base_samples(cfg: dict[str, Any], root: str | Path, per_dataset: int = 3, limit: int = 240) -> Table:
    """The first questions of each data set under each expert's prompt: the base model's raw
    response (its last `limit` characters) and what the checker extracted, strict and lenient."""
    table = Table(
        "base_samples",
        "The base model's responses and what the answer checker extracted from them",
        ["model", "data set", "question", "prompt"],
        [("", ["gold", "strict", "lenient", "correct", "response (end)"])],
    )
    mode = cfg["reward"]["mode"]
    for model in grid.models(cfg):
        for ds in cfg["grid"]["datasets"]:
            report = read_json(Layout(Path(root)).eval_base(model, ds))["model"]
            for q in report["samples"][:per_dataset]:
                for name in sorted(k for k in q if k.startswith("e") and isinstance(q[k], dict)):
                    e = q[name]
                    table.add(
                        [model, DATASET_TITLES[ds], str(q["id"]), f"expert {name[1:]}"],
                        [
                            _cell_text(q["gold"], 40),
                            _cell_text(e["strict"], 40),
                            _cell_text(e["lenient"], 40),
                            "yes" if e[f"{mode}_correct"] else "no",
                            _cell_text(e["response"], limit),
                        ],
                    )
    n = len(prompts_of(cfg))
    table.notes = [
        f"The first {per_dataset} test questions of each data set under each of the {n} expert prompts; every "
        "response is in results/<profile>/eval/<model>/<ds>/base.json. strict: the answer line only; lenient: "
        "also the last answer-like span (core/answers.py). ⏎ marks a line break."
    ]
    return table
