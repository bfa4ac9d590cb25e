"""Statistics of a built toy world: size, answer distribution, difficulty, and trajectory
length per expert style. Printed by `meml toy-stats` and written to toy_stats.{json,md}."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from meml.core.io import read_json
from meml.core.records import DATASETS, read_records
from meml.data.experts import read_trajectories, trajectory_stats


def world_stats(root: str | Path) -> dict[str, Any]:
    root = Path(root)
    out: dict[str, Any] = {}
    for ds in DATASETS:
        data = root / "data" / ds
        if not data.is_dir():
            continue
        train = read_records(data / "train.jsonl", ds)
        test = read_records(data / "test.jsonl", ds)
        difficulty = read_json(data / "difficulty.json")
        by_id = {r.id: r for r in train}
        experts = {}
        for k in range(3):
            triples = read_trajectories(root / "experts" / ds / f"e{k}.jsonl", by_id)
            experts[f"e{k}"] = trajectory_stats([c for _, _, c in triples])
        answers = Counter(r.answer for r in train + test)
        if ds == "gsm8k":  # numbers: show magnitude bands rather than 300 distinct values
            answers = Counter(_band(int(a)) for a in (r.answer for r in train + test))
        out[ds] = {
            "train": len(train),
            "test": len(test),
            "answers": dict(sorted(answers.items())),
            "difficulty": dict(sorted(Counter(difficulty[r.id] for r in train + test).items())),
            "experts": experts,
        }
    return out


def _band(n: int) -> str:
    for top in (10, 100, 1000):
        if n < top:
            return f"<{top}"
    return ">=1000"


def format_stats(stats: dict[str, Any]) -> str:
    lines = ["| data set | train | test | answers | difficulty (steps: count) |", "| --- | --- | --- | --- | --- |"]
    for ds, s in stats.items():
        answers = ", ".join(f"{k}: {v}" for k, v in s["answers"].items())
        difficulty = ", ".join(f"{k}: {v}" for k, v in s["difficulty"].items())
        lines.append(f"| {ds} | {s['train']} | {s['test']} | {answers} | {difficulty} |")
    lines += [
        "",
        "| data set | expert | trajectories | words mean | median | max |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for ds, s in stats.items():
        for name, e in s["experts"].items():
            lines.append(
                f"| {ds} | {name} | {e['count']} | {e['words_mean']} | {e['words_median']} | {e['words_max']} |"
            )
    return "\n".join(lines)
