"""What RL added to the model it started from: each cell's held-out accuracy minus that of its MEF
(or single-expert SFT) model, on the same test questions, under each evaluated expert's prompt.

The SFT models are evaluated by the same lm-eval task, checker, questions and length cap as the
cells (eval.sft: rule evaluate_sft). A cell's seed k is paired with the SFT model seed k started
from (one shared model where seeds retrain RL only), question by question, so the difference's
interval is stats.cell_estimate's: over seeds and questions, over questions alone with one seed, or
over seeds alone where each seed has its own test questions (grid.seeds_vary: world).
IML's mechanism shows here if anywhere: the weaker experts' prompts should gain more than the
strongest's, since IML pulls them towards its answers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from meml.core.io import DataError, read_json
from meml.plan import grid
from meml.reporting import stats
from meml.reporting.results import Results, correct_by_seed
from meml.reporting.tables import DATASET_TITLES, MISSING, Table, model_label


def sft_correct(results: Results, model: str, ds: str, method: str, expert: str) -> tuple[list[str], np.ndarray]:
    """(question ids, correct[seed, question]) of the SFT model each seed of the cell started from,
    under one expert's prompt, or ("vote") the majority vote of the prompts the cell is evaluated
    under, by evaluation's tie rule, in the report's checker mode."""
    cfg, evaluations = results.cfg, []
    experts = cfg["methods"][method]["sft_experts"]
    for seed in cfg["grid"]["seeds"]:
        path = results.layout.eval_sft(model, ds, grid.sft_run(cfg, experts, seed))
        if not path.is_file():
            raise DataError("the SFT model's evaluation is missing (eval.sft: true runs it)", path)
        evaluations.append((path, read_json(path)["model"].get("samples") or []))
    voters = [f"e{k}" for k in grid.eval_experts(cfg, method)]  # the SFT model answered under every prompt
    return correct_by_seed(
        evaluations, ds, results.metric, expert, results.nested, voters, "the SFT models of this cell"
    )


def paired(results: Results, model: str, ds: str, method: str, expert: str) -> tuple[np.ndarray, np.ndarray]:
    """(the cell's correct[seed, question], its SFT start's), on the same questions."""
    rl_ids, rl = results.correct(model, ds, method, expert)
    sft_ids, sft = sft_correct(results, model, ds, method, expert)
    if rl_ids != sft_ids:
        where = results.layout.eval(grid.Cell(model, ds, method, results.cfg["grid"]["seeds"][0]))
        raise DataError("the cell and its SFT model were evaluated on different questions", where)
    return rl, sft


def gain(results: Results, model: str, ds: str, method: str, expert: str) -> stats.Estimate:
    """RL minus its SFT start in points, paired by seed and question."""
    rl, sft = paired(results, model, ds, method, expert)
    return stats.cell_estimate(100 * (rl - sft), results.nested)


def learning_records(cfg: dict[str, Any], results: Results) -> list[dict[str, Any]]:
    """One record per cell (model, data set, method) and expert column it is evaluated under (and
    "vote" with several): the cell's accuracy, its SFT start's, the difference with its interval,
    the number of test questions and the data set's chance level, in points. The table shows them;
    the report writes them as tables/learning.json, which the README's line on a real model reads."""
    level = cfg["report"]["stats"]["level"]
    records = []
    for model in grid.models(cfg):
        for ds in cfg["grid"]["datasets"]:
            for method in grid.methods(cfg):
                evaluated = [f"e{k}" for k in grid.eval_experts(cfg, method)]
                for column in evaluated + (["vote"] if len(evaluated) > 1 else []):
                    correct, start = paired(results, model, ds, method, column)  # SFT files read once
                    difference, low, high = stats.cell_estimate(100 * (correct - start), results.nested).rounded(level)
                    records.append({
                        "model": model, "dataset": ds, "method": method, "expert": column,
                        "accuracy": round(100 * float(correct.mean()), 2),
                        "sft_accuracy": round(100 * float(start.mean()), 2),
                        "difference": difference, "low": low, "high": high,
                        "level": level, "questions": int(correct.shape[1]), "seeds": int(correct.shape[0]),
                        "chance": round(results.chance(model, ds, method), 2),
                        "rl_steps": len(results.steps(model, ds, method, cfg["grid"]["seeds"][0])),
                    })  # fmt: skip
    return records


def _cell(record: dict[str, Any]) -> str:
    if record["low"] is None:
        return f"{record['accuracy']:.1f} ({record['difference']:+.1f})"
    return f"{record['accuracy']:.1f} ({record['difference']:+.1f} [{record['low']:+.1f}, {record['high']:+.1f}])"


def learning_table(cfg: dict[str, Any], results: Results) -> tuple[Table, list[dict[str, Any]]]:
    """One row per model, data set and method: under each expert's prompt, the cell's accuracy and
    (in brackets) its difference from its SFT start with the interval; and the records it shows."""
    level = cfg["report"]["stats"]["level"]
    experts = sorted({k for method in grid.methods(cfg) for k in grid.eval_experts(cfg, method)})
    columns = [f"e{k}" for k in experts] + ["vote"]
    table = Table("learning", "What RL added: each cell against the SFT model it started from",
                  ["model", "data set", "method"], [("accuracy (RL minus its SFT start)", columns)])  # fmt: skip
    records = learning_records(cfg, results)
    chances: dict[str, float] = {}
    for model in grid.models(cfg):
        for ds in cfg["grid"]["datasets"]:
            for method in grid.methods(cfg):
                key = (model, ds, method)
                mine = {r["expert"]: r for r in records if (r["model"], r["dataset"], r["method"]) == key}
                chances.update((ds, r["chance"]) for r in mine.values())
                table.add([model_label(cfg, model), DATASET_TITLES[ds], method],
                          [_cell(mine[c]) if c in mine else MISSING for c in columns])  # fmt: skip
    seeds = len(cfg["grid"]["seeds"])
    table.notes = [
        f"In %, in the report's checker mode ({cfg['reward']['mode']}), on the cells' test questions. In brackets: "
        "the cell minus the SFT model it started RL from (MEF, or the single expert's SFT model), evaluated by the "
        f"same task, questions and length cap; {100 * level:.0f}% interval paired by "
        + ("question (one seed: the test sample's spread only)." if seeds == 1 else "seed and question."),
        "Chance (no reading of the question: 0 on GSM8K, a guess among MathQA's five options, StrategyQA's larger "
        "answer class): " + ", ".join(f"{DATASET_TITLES[ds]} {c:.1f}" for ds, c in chances.items()) + ". An "
        "accuracy at or below it shows no skill on either side of the difference, whatever its interval.",
    ]
    return table, records
