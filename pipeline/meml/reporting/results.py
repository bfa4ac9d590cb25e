"""The grid's results read from disk (never from the MLflow database): every cell's evaluation and
training curve, per seed, and per question for the paired comparisons of the summary.

    results/<profile>/eval/<model>/<ds>/<method>/seed<k>.json          evaluation per cell
    results/<profile>/rl/<model>/<ds>/<method>/seed<k>/metrics.jsonl   metrics per RL step
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from meml.core.answers import answers_match
from meml.core.io import DataError, read_json
from meml.core.tracking import read_metrics
from meml.evaluation.evaluate import majority_vote
from meml.plan import grid
from meml.plan.layout import Layout
from meml.reporting import stats

CHANCE = {"gsm8k": 0.0, "mathqa": 20.0}  # StrategyQA: the larger answer class's share of its test split


class Results:
    """Evaluation results and training curves of every cell in the grid, read from disk."""

    def __init__(self, cfg: dict[str, Any], root: str | Path) -> None:
        self.cfg = cfg
        self.root = Path(root)
        self.metric = cfg["reward"]["mode"]  # the checker mode the tables report
        self.headline = f"e{cfg['report']['headline_expert']}"
        self.layout = Layout(self.root)
        self.nested = grid.varies(cfg, "world")  # each seed evaluated on its own world's questions
        self.evals: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        self._steps: dict[grid.Cell, list[dict[str, float]]] = {}
        for cell in grid.cells(cfg):
            path = self.layout.eval(cell)
            if not path.is_file():
                raise DataError("evaluation result missing (run the grid first)", path)
            self.evals.setdefault((cell.model, cell.dataset, cell.method), []).append(read_json(path)["model"])

    def accuracy(self, model: str, ds: str, method: str, expert: str | None = None) -> list[float]:
        """Per-seed accuracy in %, of one expert's prompt (default: the headline expert)."""
        expert = expert or self.headline
        return [
            100 * e["experts"][expert][self.metric] for e in self.evals[(model, ds, method)] if expert in e["experts"]
        ]

    def vote(self, model: str, ds: str, method: str) -> list[float]:
        """Per-seed vote accuracy in %, in the same checker mode as every other cell of the report."""
        return [100 * e["majority_vote"][self.metric] for e in self.evals[(model, ds, method)] if "majority_vote" in e]

    def finished(self, expert: str | None = None) -> list[tuple[float, str]]:
        """(share of answers that ended within the token cap, cell) of one expert in every cell."""
        expert = expert or self.headline
        return [
            (e["experts"][expert]["finished"], f"{model}/{ds}/{method}")
            for (model, ds, method), runs in self.evals.items()
            for e in runs
            if "finished" in e["experts"].get(expert, {})
        ]

    def cut_note(self) -> str:
        """The tables' note on answers cut at the token cap (scored wrong), over every cell."""
        return cut_note([e for runs in self.evals.values() for e in runs], self.metric)

    def per_seed(self, models: list[str], datasets: list[str], method: str, get: Any = None) -> list[float]:
        """Per-seed mean over the given models and data sets of the headline accuracy (or of
        `get(model, ds, method)`, e.g. `self.vote`)."""
        get = get or self.accuracy
        columns = [get(m, ds, method) for m in models for ds in datasets]
        return [statistics.fmean(seed_values) for seed_values in zip(*columns, strict=True)]

    def average(self, model: str, method: str) -> list[float]:
        """Per-seed mean over the grid's data sets."""
        return self.per_seed([model], self.cfg["grid"]["datasets"], method)

    def correct(self, model: str, ds: str, method: str, expert: str | None = None) -> tuple[list[str], np.ndarray]:
        """(question ids, correct[seed, question] as 0/1) of one expert's prompt (default: the
        headline expert), or of the majority vote with expert="vote" (correct_by_seed)."""
        evaluations = [
            (self.layout.eval(grid.Cell(model, ds, method, seed)), e.get("samples") or [])
            for seed, e in zip(self.cfg["grid"]["seeds"], self.evals[(model, ds, method)], strict=True)
        ]
        return correct_by_seed(evaluations, ds, self.metric, expert or self.headline, self.nested)

    def golds(self, model: str, ds: str, method: str) -> list[str]:
        """The gold answers of the cell's test questions (for the chance level of a split)."""
        return [str(q["gold"]) for q in self.evals[(model, ds, method)][0].get("samples", [])]

    def chance(self, model: str, ds: str, method: str) -> float:
        """The accuracy in points that needs no reading of the question: 0 on GSM8K, a guess among
        MathQA's five options, and on StrategyQA a constant answer (its test split's larger class)."""
        if ds in CHANCE:
            return CHANCE[ds]
        golds = self.golds(model, ds, method)
        return 100 * max(golds.count(g) for g in set(golds)) / len(golds) if golds else 50.0

    def steps(self, model: str, ds: str, method: str, seed: int) -> list[dict[str, float]]:
        """The step metrics of one cell (its metrics.jsonl), read once; several figures use them."""
        cell = grid.Cell(model, ds, method, seed)
        if cell not in self._steps:
            path = self.layout.rl(cell) / "metrics.jsonl"
            self._steps[cell] = read_metrics(path)  # a damaged file names its line
        return self._steps[cell]

    def curves(self, model: str, ds: str, method: str, metric: Any = "reward/mean") -> list[list[float]]:
        """A metric per step (a name, or a function of the step's metrics), one list per seed, cut
        to the shortest run."""
        get = metric if callable(metric) else (lambda row: float(row[metric]))
        runs = [[get(row) for row in self.steps(model, ds, method, s)] for s in self.cfg["grid"]["seeds"]]
        steps = min(len(r) for r in runs) if runs else 0
        return [r[:steps] for r in runs]

    def curve(self, model: str, ds: str, method: str, metric: Any = "reward/mean") -> list[float]:
        """A metric per step, averaged over seeds."""
        runs = self.curves(model, ds, method, metric)
        return [statistics.fmean(step) for step in zip(*runs, strict=True)] if runs else []


def correct_by_seed(
    evaluations: Sequence[tuple[Path, list[dict[str, Any]]]],
    ds: str,
    metric: str,
    column: str,
    nested: bool,
    voters: Sequence[str] | None = None,
    whose: str = "the seeds of this cell",
) -> tuple[list[str], np.ndarray]:
    """(question ids, correct[seed, question] as 0/1) of evaluations, one a seed (its file, for the
    errors, and its per-question samples), in checker mode `metric`: under one expert's prompt
    (column "e1"), or the majority vote ("vote"): the one evaluation stored, or among `voters`'
    prompts by evaluation's tie rule. Every reader of per-question results comes here. The seeds
    must have scored the same questions in the same order (the comparisons pair them); where each
    seed draws a world of its own (`nested`, grid.seeds_vary: world) the same number of its own
    questions, and the ids are every seed's in turn: what a paired partner must have scored."""
    first: list[str] | None = None
    ids: list[str] = []
    rows = []
    for where, samples in evaluations:
        if not samples:
            raise DataError("evaluation has no per-question samples (re-run the evaluation)", where)
        these = [q["id"] for q in samples]
        if first is not None and len(these) != len(first):
            raise DataError(f"{whose} were evaluated on different numbers of questions", where)
        if first is not None and these != first and not nested:
            raise DataError(f"{whose} were evaluated on different questions", where)
        first = first or these
        ids += these
        if column == "vote" and voters:
            chosen = [majority_vote([q[e][metric] for e in voters]) for q in samples]
            rows.append([answers_match(c, q["gold"], ds) for c, q in zip(chosen, samples, strict=True)])
        elif column == "vote":
            rows.append([answers_match(q[f"majority_vote_{metric}"], q["gold"], ds) for q in samples])
        else:
            rows.append([bool(q[column][f"{metric}_correct"]) for q in samples])
    return (ids if nested else first or []), np.asarray(rows, dtype=np.float64)


def cut_note(reports: list[dict[str, Any]], mode: str, trained: bool = True) -> str:
    """How many answers were cut at the token cap, and how many of them looked correct (the checker
    would have taken them) but were scored wrong, over these evaluations' experts ("model" blocks);
    `trained`: the evaluations are of RL cells (whose rollouts were scored by the same rule)."""
    answers = cut = looked = 0
    rescored = False
    for report in reports:
        rescored = rescored or bool(report.get("rescored"))
        for e in report["experts"].values():
            n = report.get("questions") or len(report.get("samples", ()))
            answers += n
            cut += round(n * (1 - e.get("finished", 1.0)))
            looked += e.get("cut_correct_looking", {}).get(mode, 0)
    text = (
        f"Answers cut at the token cap score 0{' (in RL as well)' if trained and not rescored else ''}: "
        f"{cut} of {answers} answers were cut, {looked} of them correct-looking to the {mode} checker."
    )
    if rescored:
        text += " These evaluations were scored again under that rule from their stored responses"
        text += "; the RL runs predate it." if trained else "."
    return text


def subgroup_share(kind: str) -> Any:
    """Share of (question, expert) subgroups whose rollouts are all wrong (kind="all_wrong") or all
    right ("all_correct"), averaged over the method's experts: where GRPO has no gradient."""

    def get(row: dict[str, float]) -> float:
        values = [v for k, v in row.items() if k.startswith(f"subgroups/{kind}/expert")]
        return statistics.fmean(values) if values else 0.0

    return get


def ablation_flags(cfg: dict[str, Any], method: str) -> dict[str, bool]:
    """A method's row in the paper's ablation table (MoE: SFT on several experts)."""
    m = cfg["methods"][method]
    return {"moe": len(m["sft_experts"]) > 1, "hsft": bool(m["hsft"]), "iml": bool(m["iml"])}


def ablation_reference(reference: dict[str, Any], cfg: dict[str, Any], method: str) -> dict[str, Any]:
    """The paper's ablation row with the method's switches (model name -> average), or {}."""
    flags = ablation_flags(cfg, method)
    rows = reference.get("ablation", [])
    return next((r for r in rows if all(r[k] == v for k, v in flags.items())), {})


def cells_average(cfg: dict[str, Any], models: list[str], cells: list[np.ndarray]) -> stats.Estimate:
    """The average over the page's cells (models x data sets, each a seeds x questions matrix, each
    cell weighing the same). Where seeds retrain the tiny base, seed k's cells are not independent:
    every data set's SFT starts from seed k's base, and every tiny model of seed k is pretrained in
    one job from one corpus draw; where seeds redraw the data, every model of seed k trains on seed
    k's draw. They are then averaged seed by seed (stats.joint_average, valid
    whatever the cells share, so a hub model's cells may join them); otherwise the cells are
    independent runs and their variances add (stats.average)."""
    if grid.varies(cfg, "data") or (grid.varies(cfg, "pretrain") and any(grid.tiny_folder(cfg, m) for m in models)):
        return stats.joint_average(cells, grid.varies(cfg, "world"))
    return stats.average([stats.cell_estimate(x) for x in cells])
