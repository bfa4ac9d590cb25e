"""Our RL loop against trl's GRPOTrainer on the same cells (trl.methods): one figure of the reward
against step and against wall-clock time, and one table of time per step, tokens per second and
held-out accuracy, from one run on one machine. The accuracy difference is paired by question;
the speed ratio is of median step times measured in the same workflow run, trl's after ours (its
rule waits for the cell), on the same machine.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np

from meml.core.io import DataError, read_json
from meml.core.tracking import read_metrics
from meml.plan import grid
from meml.plan.layout import Layout
from meml.reporting import stats
from meml.reporting.results import Results, correct_by_seed
from meml.reporting.rl_stage import change_cell, edge_change
from meml.reporting.tables import DATASET_TITLES, Table, model_label

# what samples the rollouts: our loop's rl.engine, trl's generation (trl.vllm)
ENGINE_NAMES = {
    "kv": "the kv engine",
    "vllm": "vLLM",
    "hf": "transformers' generate",
    "hf-copy": "transformers' generate on a synced copy",
    "transformers": "transformers' generate",
}


def trl_cells(cfg: dict[str, Any]) -> list[grid.Cell]:
    return [c for c in grid.cells(cfg) if c.method in cfg["trl"]["methods"]]


def _trl_correct(results: Results, cell: grid.Cell, expert: str) -> tuple[list[str], np.ndarray]:
    path = Layout(results.root).trl(cell) / "eval.json"
    if not path.is_file():
        raise DataError("the trl run's evaluation is missing (trl.methods runs it)", path)
    samples = read_json(path)["model"].get("samples") or []
    return correct_by_seed([(path, samples)], cell.dataset, results.metric, expert, nested=False)


def _speed(rows: list[dict[str, float]]) -> tuple[float, float]:
    """(median seconds a step, mean completion tokens per second of a whole step), the first step left
    out (it warms caches and compiles kernels in both implementations)."""
    steady = rows[1:] or rows
    seconds = statistics.median(r["perf/step_seconds"] for r in steady)
    return seconds, statistics.fmean(r["perf/tokens_per_second_step"] for r in steady)


def _with_step_rate(rows: list[dict[str, float]], rollouts: int) -> list[dict[str, float]]:
    """Completion tokens per second of the whole step (generation and update): comparable between the
    two, where our loop's perf/tokens_per_second counts the rollout phase alone."""
    for r in rows:
        r["perf/tokens_per_second_step"] = r["completion/length_mean"] * rollouts / max(r["perf/step_seconds"], 1e-9)
    return rows


def trl_comparison(
    cfg: dict[str, Any], results: Results, figures: Path
) -> tuple[Table, list[Path], list[str], list[dict[str, Any]]]:
    """The table, the figure files, the index's lines and a record per cell (tables/trl.json)."""
    level = cfg["report"]["stats"]["level"]
    headline = f"e{cfg['report']['headline_expert']}"
    table = Table("trl", "Our RL loop against trl's GRPOTrainer, side by side", ["model", "data set", "method"],
                  [("ours", ["s / step", "tokens / s", "reward change", "accuracy"]),
                   ("trl", ["s / step", "tokens / s", "reward change", "accuracy"]),
                   ("ours - trl", ["accuracy", "speed"])])  # fmt: skip
    lines, files, records = [], [], []
    for cell in trl_cells(cfg):
        settings = grid.cell_values(cfg, cell)["rl"]
        rollouts = int(settings["questions_per_step"]) * int(settings["group_size"])
        ours = _with_step_rate(read_metrics(results.layout.rl(cell) / "metrics.jsonl"), rollouts)
        theirs = _with_step_rate(read_metrics(Layout(results.root).trl(cell) / "metrics.jsonl"), rollouts)
        ids, ours_right = results.correct(cell.model, cell.dataset, cell.method, headline)
        trl_ids, trl_right = _trl_correct(results, cell, headline)
        if ids != trl_ids:
            raise DataError("our cell and trl's were evaluated on different questions", results.layout.eval(cell))
        ours_right = ours_right[results.cfg["grid"]["seeds"].index(cell.seed)][None, :]
        diff = stats.cell_estimate(100 * (ours_right - trl_right))
        (s_ours, t_ours), (s_trl, t_trl) = _speed(ours), _speed(theirs)
        engines = {"ours": str(settings["engine"]), "trl": "vllm" if cfg["trl"]["vllm"] else "transformers"}
        faster, ratio = ("ours", s_trl / s_ours) if s_ours <= s_trl else ("trl", s_ours / s_trl)
        low, high = diff.interval(level) if diff.has_interval else (float("nan"), float("nan"))
        change = {who: edge_change([r["reward/mean"] for r in rows]) for who, rows in (("ours", ours), ("trl", theirs))}
        table.add(
            [model_label(cfg, cell.model), DATASET_TITLES[cell.dataset], f"{cell.method} (seed {cell.seed})"],
            [f"{s_ours:.1f}", f"{t_ours:.0f}", change_cell(change["ours"], level), f"{100 * ours_right.mean():.1f}",
             f"{s_trl:.1f}", f"{t_trl:.0f}", change_cell(change["trl"], level), f"{100 * trl_right.mean():.1f}",
             f"{diff.mean:+.1f} [{low:+.1f}, {high:+.1f}]", f"{faster} {ratio:.2f}x faster"],
        )  # fmt: skip
        who = "our loop" if faster == "ours" else "trl"
        lines.append(
            f"- {cell.model}/{cell.dataset}/{cell.method} seed {cell.seed}: {who} is the faster, {ratio:.2f}x by "
            f"median step time ({s_ours:.1f} s against trl's {s_trl:.1f} s, measured in this run; rollouts sampled by "
            f"{ENGINE_NAMES[engines['ours']]} in ours, {ENGINE_NAMES[engines['trl']]} in trl's); held-out "
            f"accuracy (expert {headline[1:]}) ours minus trl's {diff.mean:+.1f} points [{low:+.1f}, {high:+.1f}]; "
            f"training reward, last steps minus first, ours {change_cell(change['ours'], level)}, "
            f"trl's {change_cell(change['trl'], level)}."
        )
        files += _figure(cfg, cell, ours, theirs, figures)
        records.append({
            "model": cell.model, "dataset": cell.dataset, "method": cell.method, "seed": cell.seed,
            "steps": {"ours": len(ours), "trl": len(theirs)},
            "step_seconds": {"ours": round(s_ours, 2), "trl": round(s_trl, 2)},
            "tokens_per_second": {"ours": round(t_ours, 1), "trl": round(t_trl, 1)},
            "accuracy": {"ours": round(100 * float(ours_right.mean()), 2),
                         "trl": round(100 * float(trl_right.mean()), 2)},
            **dict(zip(("difference", "low", "high"), diff.rounded(level), strict=True)), "level": level,
            "faster": faster, "ratio": round(ratio, 3), "engines": engines,
            "reward_change": {who: _change_record(est, level) for who, est in change.items()},
        })  # fmt: skip
    table.notes = [
        "Both start from the cell's SFT model and see the same questions in the same order, with the same reward, "
        "G, lr, answer cap, steps and temperature (training/trl_grpo.py lists what differs). s / step: the median over "
        "steps after the first; tokens / s: completion tokens per second of a whole step (generation and update); "
        "reward change: the training reward's mean over the last steps minus over the first (points; as many steps "
        "at each end as the index's RL-stage table takes), with Welch's interval over those steps; "
        f"accuracy: held-out, expert {headline[1:]}'s prompt, {cfg['reward']['mode']} checker; ours - trl: the "
        f"accuracy difference paired by question with its {100 * level:.0f}% interval, and the step-time ratio. "
        "One run on one machine: the ratio holds for this machine and these shapes."
    ]
    return table, files, lines, records


def _change_record(est: stats.Estimate, level: float) -> dict[str, float | None]:
    """A reward change for trl.json: what too few steps leave undefined is null, not NaN, which JSON lacks."""
    return dict(zip(("mean", "low", "high"), est.rounded(level), strict=True))


def _figure(cfg: dict[str, Any], cell: grid.Cell, ours: list[dict[str, float]], theirs: list[dict[str, float]],
            out: Path) -> list[Path]:  # fmt: skip
    from meml.reporting.figures import _pyplot, _save

    plt = _pyplot()
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(9, 3.4))
    for rows, label in ((ours, "ours"), (theirs, "trl GRPOTrainer")):
        reward = [r["reward/mean"] for r in rows]
        wall = np.cumsum([r["perf/step_seconds"] for r in rows]) / 60
        by_step.plot(range(1, len(rows) + 1), reward, label=label, lw=1.2)
        by_time.plot(wall, reward, label=label, lw=1.2)
    by_step.set(xlabel="RL step", ylabel="training reward (mean)")
    by_time.set(xlabel="wall clock (minutes)")
    by_step.legend(fontsize=8)
    title = f"{model_label(cfg, cell.model)}, {DATASET_TITLES[cell.dataset]}, {cell.method}: ours and trl"
    return _save(fig, cfg, title, out / f"trl_{cell.model}_{cell.dataset}_{cell.method}_seed{cell.seed}")
