"""Tables and figures built from result files, checked against numbers worked out by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import PROJECT

from meml.core.config import load_config
from meml.core.io import DataError
from meml.plan import grid
from meml.plan.layout import Layout as grid_layout
from meml.reporting import stats
from meml.reporting.report import build

# expert-1 accuracy per (method, data set, seed); every other expert scores 0.30, the vote 0.40
E1 = {
    ("MEML-GRPO", "gsm8k"): [0.10, 0.20],
    ("MEML-GRPO", "mathqa"): [0.50, 0.60],
    ("MoE+HSFT", "gsm8k"): [0.30, 0.30],
    ("MoE+HSFT", "mathqa"): [0.10, 0.10],
}
SFT_E1 = 0.10  # every SFT start's expert-1 accuracy (eval.sft)


def _config(**overrides: object) -> dict:
    return load_config(
        overrides={
            "profile": "t",
            "grid.models": ["qwen2"],
            "grid.datasets": ["gsm8k", "mathqa"],
            "grid.seeds": [0, 1],
            "mlflow.enabled": False,
            **overrides,
        }
    )


def _samples(ds: str, experts: dict, vote: bool, n: int = 10) -> list[dict]:
    """n questions per cell: an expert with accuracy p is right on the first p * n of them, the
    vote on the first 4 (lenient) or 2 (strict), the same questions in every cell."""
    gold = "1" if ds == "gsm8k" else "a"
    rows = []
    for q in range(n):
        row: dict = {"id": f"{ds}-{q}", "gold": gold}
        for name, scores in experts.items():
            row[name] = {mode: None for mode in ("strict", "lenient")}
            for mode in ("strict", "lenient"):
                row[name][f"{mode}_correct"] = q < round(scores[mode] * n)
        if vote:
            row["majority_vote_lenient"] = gold if q < 4 else "9"
            row["majority_vote_strict"] = gold if q < 2 else None
        rows.append(row)
    return rows


def _write_results(cfg: dict, root: Path, e1_table: dict | None = None) -> None:
    for cell in grid.cells(cfg):
        e1 = (E1 if e1_table is None else e1_table).get((cell.method, cell.dataset), [0.20, 0.20])[cell.seed]
        experts = {
            f"e{k}": {"strict": 0.0, "lenient": e1 if k == 1 else 0.30, "finished": 0.5 if cell.seed else 1.0}
            for k in grid.eval_experts(cfg, cell.method)
        }
        block = {"experts": experts, "samples": _samples(cell.dataset, experts, len(experts) > 1)}
        if len(experts) > 1:
            block["majority_vote"] = {"strict": 0.20, "lenient": 0.40}
        path = root / "eval" / f"{cell.path}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"model": block}))
        run = root / "rl" / cell.path
        run.mkdir(parents=True, exist_ok=True)
        rows = [
            {"step": i, "reward/mean": 0.1 * (i + 1) + 0.1 * cell.seed, "iml/pairs": 1.0, "hsft/flushes": float(i),
             "subgroups/all_wrong/expert0": 0.5, "subgroups/all_wrong/expert1": 1.0,
             "subgroups/all_correct/expert0": 0.0, "subgroups/all_correct/expert1": 0.25,
             "perf/step_seconds": 2.0, "rollouts/sampled": 48.0 if "per_expert" in cell.method else 16.0}
            for i in range(3)
        ]  # fmt: skip
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    for model, ds, variant in grid.calibrated(cfg):  # every SFT start: expert 1 right on 1 question in 10
        if not cfg["eval"]["sft"]:
            break
        experts = {f"e{k}": {"strict": 0.0, "lenient": SFT_E1 if k == 1 else 0.30} for k in (0, 1, 2)}
        path = grid_layout(root).eval_sft(model, ds, variant)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"model": {"experts": experts, "samples": _samples(ds, experts, True)}}))

    for model, ds, variant in grid.calibrated(cfg):  # MoE models in range; expert-1-only ones not
        moe = variant == "e0-e1-e2"
        calibration = {
            "train_questions": 8,
            "samples": 4,
            "rollout_success": {"e0": 0.3, "e1": 0.25, "e2": 0.4} if moe else {"e1": 0.05},
            "finished": {"e0": 1.0, "e1": 0.97, "e2": 0.99} if moe else {"e1": 0.5},
            **({"mean_tokens": {"e0": 24.0, "e1": 108.4, "e2": 87.6}} if moe else {}),  # older files lack it
            **({"mixed_groups": {"e0": 0.5, "e1": 0.625, "e2": 0.375}} if moe else {}),  # and this
            "greedy": {"expert": 1, "questions": 10, "accuracy": 0.3 if moe else 0.0},
            "answer_balance": None if ds == "gsm8k" else {"largest_class": "b", "largest_share": 0.24},
            "in_range": moe,
            "problems": [] if moe else ["expert 1's rollout success 0.05 is outside ..."],  # the gate's own lines
        }
        path = root / "calibration" / model / ds / f"{variant}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(calibration))

    stats = {
        "error_rate": {"e0": 0.35, "e1": 0.25, "e2": 0.20},
        "all_wrong_among_wrong": 0.10,
        "solved_by_another": {"e0": 0.5, "e1": 0.7, "e2": None},
        "at_least_one_correct": 0.95,
    }
    for ds in cfg["grid"]["datasets"]:
        stem = root / "analysis" / "complementarity" / f"qwen2_{ds}"
        stem.parent.mkdir(parents=True, exist_ok=True)
        stem.with_suffix(".json").write_text(json.dumps(stats))
        for ext in (".png", ".pdf"):
            stem.with_suffix(ext).write_bytes(b"figure")


def _row(text: str, *labels: str) -> list[str]:
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if all(label in cells for label in labels):
            return cells
    raise AssertionError(f"no row with {labels} in\n{text}")


@pytest.fixture
def built(tmp_path: Path) -> tuple[dict, Path]:
    cfg = _config()
    _write_results(cfg, tmp_path / "results")
    build(cfg, tmp_path / "results", tmp_path / "report", PROJECT / "report" / "paper_reference.yaml")
    return cfg, tmp_path / "report"


def test_main_table_mean_sd_paper_and_difference(built: tuple[dict, Path]) -> None:
    _, out = built
    row = _row((out / "tables/main.md").read_text(), "MEML-GRPO")
    # gsm8k: 10 and 20 -> 15.0 ± 7.1 against 79.6; mathqa: 50, 60 -> 55.0 ± 7.1 against 76.4;
    # average per seed (10+50)/2 = 30 and (20+60)/2 = 40 -> 35.0 ± 7.1 against (79.6+76.4)/2 = 78.0
    assert row[2:] == ["15.0 ± 7.1", "79.6", "-64.6", "55.0 ± 7.1", "76.4", "-21.4", "35.0 ± 7.1", "78.0", "-43.0"]
    assert row[0] == "Qwen2.5-Math-1.5B (toy: qwen2)"
    assert "Toy scale" in (out / "tables/main.md").read_text()
    assert "MoE+HSFT" not in (out / "tables/main.md").read_text()  # an ablation-only row


def test_ablation_rows_match_the_papers_by_switches(built: tuple[dict, Path]) -> None:
    _, out = built
    text = (out / "tables/ablation.md").read_text()
    # MoE+HSFT: (30 + 10) / 2 = 20 in both seeds, against the paper's MoE+HSFT row, 76.4
    assert _row(text, "MoE+HSFT") == ["x", "x", "-", "MoE+HSFT", "20.0 ± 0.0", "76.4", "-56.4"]
    assert _row(text, "Expert1-SFT-GRPO")[:4] == ["-", "-", "-", "Expert1-SFT-GRPO"]
    assert _row(text, "Expert1-SFT-GRPO")[5] == "70.1"


def test_finished_share_in_the_main_tables_notes(built: tuple[dict, Path]) -> None:
    _, out = built
    # seeds 0 and 1 finish 100% and 50% of expert 1's answers in every cell: mean 75%, lowest 50%
    assert "ended within the token cap: mean 75.0%, lowest 50.0%" in (out / "tables/main.md").read_text()


def test_vote_is_scored_in_the_tables_checker_mode(tmp_path: Path) -> None:
    cfg = _config(**{"reward.mode": "strict"})
    _write_results(cfg, tmp_path / "results")
    build(cfg, tmp_path / "results", tmp_path / "report", PROJECT / "report" / "paper_reference.yaml")
    vote = _row((tmp_path / "report/tables/majority_vote.md").read_text(), "MEML-GRPO")
    assert vote[2:5] == ["0.0 ± 0.0", "20.0 ± 0.0", "-20.0"]  # strict expert 1 (0) against the strict vote (20)


def test_ablation_shows_both_paper_values_where_its_tables_disagree(tmp_path: Path) -> None:
    cfg = _config(**{"grid.datasets": ["gsm8k", "strategyqa", "mathqa"]})
    _write_results(cfg, tmp_path / "results")
    build(cfg, tmp_path / "results", tmp_path / "report", PROJECT / "report" / "paper_reference.yaml")
    text = (tmp_path / "report/tables/ablation.md").read_text()
    # Expert1-SFT-GRPO: ablation 70.1; main (73.1 + 62.5 + 71.8) / 3 = 69.13
    assert _row(text, "Expert1-SFT-GRPO")[5] == "70.1 (main: 69.1)"
    # MEML-GRPO: ablation 77.3; main (79.6 + 75.3 + 76.4) / 3 = 77.1
    assert _row(text, "MEML-GRPO")[5] == "77.3 (main: 77.1)"
    assert _row(text, "MoE+HSFT")[5] == "76.4"  # not in the main table


def test_vote_and_complementarity_tables(built: tuple[dict, Path]) -> None:
    _, out = built
    vote = _row((out / "tables/majority_vote.md").read_text(), "MEML-GRPO")
    assert vote[2:5] == ["15.0 ± 7.1", "40.0 ± 0.0", "-25.0"]  # expert 1 minus the vote
    comp = (out / "tables/complementarity.md").read_text()
    # the paper's StrategyQA error rates are not in this grid; GSM8K has two reference values
    assert _row(comp, "all experts wrong, share of wrong draws")[2:5] == ["10.0", "30.0", "-20.0"]
    assert _row(comp, "one expert's errors solved by another (mean)")[2:5] == ["60.0", "60.0", "+0.0"]
    assert _row(comp, "error rate, expert 0")[2:5] == ["35.0", "–", "–"]


def test_sparsity_table_and_dashboard(built: tuple[dict, Path]) -> None:
    _, out = built
    row = _row((out / "tables/sparsity.md").read_text(), "MEML-GRPO")
    # all wrong: mean of experts 0.5 and 1.0 = 75%; all right: (0 + 0.25) / 2 = 12.5%; IML pairs 1 a
    # step over 3 steps; flushes: the counter at the last step, 2; the same in both seeds
    assert row[2:6] == ["75.0 ± 0.0", "12.5 ± 0.0", "3.0 ± 0.0", "2.0 ± 0.0"]
    for ds in ("gsm8k", "mathqa"):
        assert (out / f"figures/sparsity_{ds}.png").stat().st_size > 1000


def test_calibration_table_and_warnings(built: tuple[dict, Path]) -> None:
    _, out = built
    table = (out / "tables/calibration.md").read_text()
    assert _row(table, "GSM8K", "e0-e1-e2")[3:] == [
        "e0 30 · e1 25 · e2 40",
        "e0 50 · e1 62 · e2 38",
        "97",
        "e0 24 · e1 108 · e2 88",
        "30.0",
        "–",
        "yes",
    ]
    assert _row(table, "MathQA", "e1")[3:] == ["e1 5", "–", "50", "–", "0.0", "b 24", "no"]
    index = (out / "index.md").read_text()
    assert (
        "- qwen2/mathqa/e1: rollout success e1 5 (range 30-60); finished e1 50 (range 95-100); "
        "greedy accuracy e1 0 (range 30-65)" in index
    )  # MathQA's own ranges (calibration.ranges_by_dataset), above a letter guess's 20%
    assert (
        "GSM8K rollout success 20-45, finished 95-100, greedy 25-60; "
        "MathQA rollout success 30-60, finished 95-100, greedy 30-65." in table
    )
    assert "qwen2/gsm8k/e0-e1-e2:" not in index  # in range: no warning


def test_every_file_and_the_index(built: tuple[dict, Path]) -> None:
    _, out = built
    for name in ("main", "ablation", "majority_vote", "complementarity", "sparsity"):
        tex = (out / f"tables/{name}.tex").read_text()
        assert tex.count(r"\begin{tabular}") == tex.count(r"\end{tabular}") == 1
        assert f"tables/{name}.md" in (out / "index.md").read_text()
    for ds in ("gsm8k", "mathqa"):
        assert (out / f"figures/reward_curves_{ds}.png").stat().st_size > 1000
        assert (out / f"figures/reward_curves_{ds}.pdf").is_file()
        assert (out / f"figures/complementarity_qwen2_{ds}.png").read_bytes() == b"figure"


def test_missing_result_is_named(tmp_path: Path) -> None:
    cfg = _config()
    _write_results(cfg, tmp_path / "results")
    (tmp_path / "results/eval/qwen2/mathqa/MoE+IML/seed1.json").unlink()
    with pytest.raises(DataError, match=r"MoE\+IML/seed1.json: evaluation result missing"):
        build(cfg, tmp_path / "results", tmp_path / "report", PROJECT / "report" / "paper_reference.yaml")


def test_teachers_table_from_the_stats_files(tmp_path: Path) -> None:
    from meml.reporting.analysis_tables import teachers_table
    from meml.reporting.tables import to_latex

    cfg = load_config(overrides={"world": "real", "grid.datasets": ["gsm8k"]})
    folder = tmp_path / "real/experts/gsm8k"
    folder.mkdir(parents=True)
    for k, (acc, kept) in {1: (0.8125, 90), 2: (None, 0)}.items():
        stats = {"acceptance_rate": acc, "questions_with_trajectory": kept, "questions": 100,
                 "length": {"words_mean": 321.5} if kept else {"count": 0}}  # fmt: skip
        (folder / f"e{k}.stats.json").write_text(json.dumps(stats))
    table = teachers_table(cfg, tmp_path, 3)
    assert table.rows == [["GSM8K", "81.2", "90 / 100", "321.5", "–", "0 / 100", "–"]]
    assert r"\multicolumn{3}{c}{expert 2}" in to_latex(table)


def test_extra_tables_and_summary_by_hand(tmp_path: Path) -> None:
    cfg = _config(**{"extras.methods": ["MEML-B4", "MEML-per_expert"]})
    _write_results(cfg, tmp_path / "results")
    build(cfg, tmp_path / "results", tmp_path / "report", PROJECT / "report" / "paper_reference.yaml")
    tables = tmp_path / "report" / "tables"
    sensitivity = (tables / "sensitivity.md").read_text()
    # on extras.datasets = [gsm8k]: MEML-GRPO's seeds 10 and 20 -> 15.0 ± 7.1; MEML-B4 scores 20 on both
    assert _row(sensitivity, "MEML-GRPO")[3:6] == ["15.0 ± 7.1", "15.0 ± 7.1", "10.0 / 20.0"]
    assert _row(sensitivity, "MEML-B4")[2:6] == ["experts 0,1,2 · grpo · IML · HSFT · buffer.capacity=4",
                                                 "20.0 ± 0.0", "20.0 ± 0.0", "20.0 / 20.0"]  # fmt: skip
    compute = (tables / "compute.md").read_text()
    # 3 steps of 16 (shared) or 48 (per expert) rollouts, 2 s a step
    assert _row(compute, "MEML-GRPO")[-2:] == ["48", "6.0"] and _row(compute, "MEML-per_expert")[-2:] == ["144", "6.0"]
    assert (tables / "gain.tex").is_file() and "Expert1+HSFT" not in (tables / "gain.md").read_text()  # not run
    index = (tmp_path / "report" / "index.md").read_text()
    # IML adds to HSFT: per question, MEML-GRPO minus MoE+HSFT. gsm8k: seed 0 right on q0 against
    # q0-q2 (-100 on q1, q2), seed 1 on q0-q1 (-100 on q2): mean -300 / 20 = -15; mathqa: q0-q4 and
    # q0-q5 against q0 (+100 on 4 and 5 questions): +45. Average over the two cells: +15.
    line = next(x for x in index.splitlines() if x.startswith("- IML adds to HSFT"))
    assert "MEML-GRPO 35.0 vs MoE+HSFT 20.0, difference +15.0 [95% CI" in line
    # 2 seeds: the interval is shown, but the rule gives no verdict below 3 seeds (docs/grid.md, "Verdicts")
    assert "**no verdict (2 seeds)**" in line and "Holm p = " not in line
    # one expert against its vote (40% on every cell): 35 - 40 = -5; "matches" tests -5 against -2
    assert "MEML-GRPO 35.0 vs MEML-GRPO (vote) 40.0, difference -5.0" in index
    # the open questions: the sensitivity methods against MEML-GRPO, each its own comparison
    assert "- Moving this one setting changes MEML-GRPO's accuracy (MEML-B4) (sensitivity table)" in index
    tested = int(index.split(" comparisons tested")[0].split()[-3])
    assert tested == sum(x.count("Holm p ") for x in index.splitlines())
    # complementarity: a figure without a verdict; solved by another (50 + 70) / 2 = 60.0
    assert "60.0% here" in index and "at least one expert right in 95.0% of draws (one sampling run" in index


def test_methods_evaluated_on_different_questions_are_not_compared(tmp_path: Path) -> None:
    cfg = _config(**{"eval.sft": False})  # (with it, the cell against its SFT start is refused first)
    _write_results(cfg, tmp_path / "results")
    path = tmp_path / "results/eval/qwen2/gsm8k/MoE+HSFT/seed0.json"
    data = json.loads(path.read_text())
    data["model"]["samples"][0]["id"] = "another-question"
    path.write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"seeds of this cell were evaluated on different questions"):
        build(cfg, tmp_path / "results", tmp_path / "report", PROJECT / "report" / "paper_reference.yaml")
    for seed in (0, 1):  # both seeds moved: the cell is consistent, but no longer paired with the others
        path = tmp_path / f"results/eval/qwen2/gsm8k/MoE+HSFT/seed{seed}.json"
        data = json.loads(path.read_text())
        data["model"]["samples"][0]["id"] = "another-question"
        path.write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"MoE\+HSFT and MoE-SFT-GRPO were evaluated on different questions"):
        build(cfg, tmp_path / "results", tmp_path / "report", PROJECT / "report" / "paper_reference.yaml")


def test_seeds_with_worlds_of_their_own_pair_within_the_seed_and_take_the_interval_over_seeds(tmp_path: Path) -> None:
    """grid.seeds_vary: world: seed 1 scored other questions (its own world's) than seed 0, in every
    cell alike: the comparisons pair within the seed, and the interval is the t-interval over the
    seeds' means. IML adds to HSFT by seed (the numbers of the test above): gsm8k -20 and -10,
    mathqa +40 and +50; averaged over the cells 10 and 20: mean 15, var 50, se sqrt(50 / 2) = 5 on
    1 df, 15 +- 12.706 * 5."""
    cfg = _config(**{"grid.seeds_vary": ["world", "data", "pretrain", "sft", "rl"]})
    _write_results(cfg, tmp_path / "results")
    for path in (tmp_path / "results/eval").rglob("seed1.json"):
        data = json.loads(path.read_text())
        for q in data["model"]["samples"]:
            q["id"] = f"world1-{q['id']}"
        path.write_text(json.dumps(data))
    build(cfg, tmp_path / "results", tmp_path / "report", PROJECT / "report" / "paper_reference.yaml")
    index = (tmp_path / "report" / "index.md").read_text()
    line = next(x for x in index.splitlines() if x.startswith("- IML adds to HSFT"))
    assert "difference +15.0 [95% CI -48.5, +78.5]" in line, line
    assert "each seed draws a world of its own" in index
    assert "(same seeds, each on its own world's test questions) with a 95% interval over the seeds" in index
    # a seed that scored fewer questions is still refused by name
    path = tmp_path / "results/eval/qwen2/gsm8k/MoE+HSFT/seed1.json"
    data = json.loads(path.read_text())
    data["model"]["samples"].pop()
    path.write_text(json.dumps(data))
    with pytest.raises(DataError, match="different numbers of questions"):
        build(cfg, tmp_path / "results", tmp_path / "report", PROJECT / "report" / "paper_reference.yaml")


def test_replication_table_pools_independent_runs(tmp_path: Path) -> None:
    cfg = _config(**{"report.replicates": ["t2"]})
    results = tmp_path / "results"
    with pytest.raises(DataError, match="replicate 't2' has no results") as err:
        _write_results(cfg, results / "t")
        build(cfg, results / "t", tmp_path / "report", PROJECT / "report" / "paper_reference.yaml")
    assert err.value.field == "report.replicates"
    _write_results(cfg, results / "t2")  # the same numbers: every claim agrees, and pooling halves the variance
    build(cfg, results / "t", tmp_path / "report", PROJECT / "report" / "paper_reference.yaml")
    table = (tmp_path / "report" / "tables" / "replication.md").read_text()
    index = (tmp_path / "report" / "index.md").read_text()
    line = next(x for x in index.splitlines() if x.startswith("- IML adds to HSFT"))
    one = line.split("difference ")[1].split(" [95% CI ")
    mean, (lo, hi) = float(one[0]), (float(v) for v in one[1].split("]")[0].split(", "))
    row = _row(table, "IML adds to HSFT (the full method)")
    assert row[1] == row[3] and row[-1] == "yes"  # both runs: the same difference [CI]
    # between runs: z 0, no heterogeneity, each interval covers the other's estimate
    assert row[7:11] == ["+0.0", "0.0", "0", "2 of 2"]
    pooled_mean = float(row[5].split(" [")[0])
    assert pooled_mean == mean == 15.0
    # pooled: the same mean, standard error / sqrt(2), so a narrower interval (Satterthwaite df doubles)
    p_lo, p_hi = (float(v) for v in row[5].split(" [")[1].rstrip("]").split(", "))
    assert p_hi - p_lo < hi - lo
    assert "Replication (2 independent runs: `t`, `t2`" in index and "9 of 9 claims get the same verdict" in index
    assert "covers the other run's estimate in 18 of 18 (claim, run) pairs" in index
    assert "sum of z^2 0.0 over 9 claims" in index and "heterogeneity between runs" in index
    assert any(
        x.startswith("| claim | run `t` difference [95% CI] | run `t` verdict | run `t2` difference")
        for x in table.splitlines()
    )


def test_a_replicate_of_another_design_is_refused(tmp_path: Path) -> None:
    """A copy of the study's recipe with one key changed names the old runs as its replicates: their
    cells were trained with other values (cell.json), so they are refused, by name, not pooled."""
    cfg = _config(**{"report.replicates": ["t2"]})
    results = tmp_path / "results"
    for run, lr in (("t", 1e-4), ("t2", 2e-4)):
        _write_results(cfg, results / run)
        cell = results / run / "rl/qwen2/gsm8k/MoE+HSFT/seed0"
        cell.mkdir(parents=True, exist_ok=True)
        (cell / "cell.json").write_text(json.dumps({"method": "MoE+HSFT", "rl": {"lr": lr}}))
    with pytest.raises(DataError, match=r"replicate 't2' is not this grid run again.*\(rl\)") as err:
        build(cfg, results / "t", tmp_path / "report", PROJECT / "report" / "paper_reference.yaml")
    assert err.value.field == "report.replicates" and "MoE+HSFT/seed0/cell.json" in str(err.value)
    (results / "t2/rl/qwen2/gsm8k/MoE+HSFT/seed0/cell.json").write_text(
        (results / "t/rl/qwen2/gsm8k/MoE+HSFT/seed0/cell.json").read_text()
    )
    build(cfg, results / "t", tmp_path / "report", PROJECT / "report" / "paper_reference.yaml")  # the same values
    assert (tmp_path / "report" / "tables" / "replication.md").is_file()


@pytest.mark.parametrize(
    ("seeds_vary", "models"),
    [(["rl"], ["qwen2"]), (["sft", "rl"], ["qwen2"]), (["pretrain", "sft", "rl"], ["qwen2"]),
     (["pretrain", "sft", "rl"], ["qwen2", "llama"])],
)  # fmt: skip
def test_cells_of_one_seed_base_are_averaged_seed_by_seed(
    tmp_path: Path, seeds_vary: list[str], models: list[str]
) -> None:
    cfg = _config(**{"grid.seeds_vary": seeds_vary, "grid.models": models})
    _write_results(cfg, tmp_path / "results")
    build(cfg, tmp_path / "results", tmp_path / "report", PROJECT / "report" / "paper_reference.yaml")
    line = next(x for x in (tmp_path / "report" / "index.md").read_text().splitlines() if x.startswith("- IML adds"))
    # MEML-GRPO minus MoE+HSFT (test_extra_tables_and_summary_by_hand), in points, 10 questions.
    # gsm8k: -100 on q1, q2 (seed 0) and q2 (seed 1): row means -20, -10, MS_seed 500,
    # MS_q 2 (15^2 + 35^2 + 85^2 + 7 15^2) / 9 = 2277.8, MS_e 500. mathqa: +100 on q1-q4 (seed 0) and
    # q1-q5 (seed 1): rows 40, 50, MS_seed 500, MS_q 2 (45^2 + 4 55^2 + 5^2 + 4 45^2) / 9 = 4944.4, MS_e 500.
    ms_q1, ms_q2 = 2 * 10250 / 9, 2 * 22250 / 9
    if "pretrain" in seeds_vary:  # seed s's cells share its base: per-seed averages 10, 20
        # (both tiny models of seed s are pretrained in one job: their cells, here the same numbers,
        # join the seed's average; K = 4 cells then, each question part over S n K^2 = 320)
        k2 = 4 * len(models) ** 2
        parts = [(50 / 2, 1)] + [(v / (20 * k2), 9) for _ in models for v in (ms_q1, -500, ms_q2, -500)]
    else:  # independent cells: each cell's (MS_seed + MS_q - MS_e) / (S n), over K^2 = 4 (one model)
        parts = [(v / 80, df) for ms_q in (ms_q1, ms_q2) for v, df in ((500, 1), (ms_q, 9), (-500, 9))]
    var = sum(v for v, _ in parts)
    est = stats.Estimate(15.0, math.sqrt(var), var**2 / sum(v * v / df for v, df in parts))
    assert "difference +15.0 [95% CI {:+.1f}, {:+.1f}]".format(*est.interval()) in line


def test_where_the_spread_comes_from_by_hand(built: tuple[dict, Path]) -> None:
    index = (built[1] / "index.md").read_text()
    line = next(x for x in index.splitlines() if x.startswith("- qwen2 x gsm8k, training / test:"))
    # MEML-GRPO on gsm8k, 10 questions: seed 0 right on q0, seed 1 on q0 and q1 (points). Mean 15;
    # MS_seed = 10 * (5^2 + 5^2) = 500; MS_q = 2 * (85^2 + 35^2 + 8 * 15^2) / 9 = 2277.8; residuals
    # +-5 (x 18) and +-45 (x 2): MS_e = 4500 / 9 = 500. Training sd sqrt((500 - 500) / 10) = 0; test
    # sd sqrt(((2277.8 - 500) / 2 + 500) / 10) = 11.8
    assert "MEML-GRPO 0.0 / 11.8" in line
    assert "(a seed retrains: rl; the data are the same for every seed)" in index


def _write_starts(cfg: dict, root: Path, sft_per_seed: bool, base_per_seed: bool) -> None:
    """The DONE files' record of the weights each run started from: every seed's RL from its own SFT
    model or all from one, every seed's SFT from its own base or all from one."""
    for cell in grid.cells(cfg):
        start = f"sft-{cell.method}-{cell.seed if sft_per_seed else 0}"
        (root / "rl" / cell.path / "DONE").write_text(json.dumps({"environment": {"start_weights_sha256": start}}))
    if sft_per_seed:
        for model, ds, run in {(c.model, c.dataset, grid.sft_run(cfg, [0, 1, 2], c.seed)) for c in grid.cells(cfg)}:
            for variant in (run, run.replace("e0-e1-e2", "e1")):
                seed = grid.run_seed(variant)
                done = root / "sft" / model / ds / variant / "DONE"
                done.parent.mkdir(parents=True, exist_ok=True)
                base = f"base-{seed if base_per_seed else 0}"
                done.write_text(json.dumps({"environment": {"start_weights_sha256": base}}))


def test_stages_split_the_training_variance_by_hand(tmp_path: Path) -> None:
    runs = {"t-sft": "report.stages.sft", "t-rl": "report.stages.rl"}
    cfg = _config(**{"grid.seeds_vary": ["pretrain", "sft", "rl"], "report.stages": {"sft": "t-sft", "rl": "t-rl"}})
    results = tmp_path / "results"
    # expert 1's accuracy per seed, right on the first p * 10 questions. MEML-GRPO on gsm8k: whole chain
    # [0.1, 0.5], SFT and RL only [0.2, 0.4], RL only [0.3, 0.3]. With 2 seeds the seed component is
    # d^2 / 2 - sum_j (delta_j - d)^2 / (2 n (n - 1)), delta_j = seed 0 minus seed 1 on question j, d
    # their mean: whole chain d = -40, deltas 0, -100 x 4, 0 x 5: 800 - 24000 / 180 = 666.7 (sd 25.8);
    # SFT and RL d = -20, deltas 0 x 2, -100 x 2, 0 x 6: 200 - 16000 / 180 = 111.1 (sd 10.5); RL only 0.
    # Shares of 666.7: pretraining 555.6 (83%), SFT 111.1 (17%), RL 0 (0%). MoE-SFT-GRPO on mathqa the
    # other way round (whole chain [0.2, 0.4], SFT and RL [0.1, 0.5]): pretraining -555.6 of 111.1, -500%.
    # MoE+IML on gsm8k as MEML-GRPO, but its RL-only seeds right on q0 and on q1 (edited below): d = 0,
    # deltas +100, -100, 0 x 8: 0 - 20000 / 180 = -111.1 before the clip (sd 0.0). Unclipped, RL is
    # -111.1 (-17%) and SFT 111.1 + 111.1 (33%); clipped on each side they would read 0% and 17%.
    design = {
        "t": {
            ("MEML-GRPO", "gsm8k"): [0.1, 0.5],
            ("MoE-SFT-GRPO", "mathqa"): [0.2, 0.4],
            ("MoE+IML", "gsm8k"): [0.1, 0.5],
        },
        "t-sft": {
            ("MEML-GRPO", "gsm8k"): [0.2, 0.4],
            ("MoE-SFT-GRPO", "mathqa"): [0.1, 0.5],
            ("MoE+IML", "gsm8k"): [0.2, 0.4],
        },
        "t-rl": {
            ("MEML-GRPO", "gsm8k"): [0.3, 0.3],
            ("MoE-SFT-GRPO", "mathqa"): [0.3, 0.3],
            ("MoE+IML", "gsm8k"): [0.1, 0.1],
        },
    }
    reference = PROJECT / "report" / "paper_reference.yaml"
    _write_results(cfg, results / "t", design["t"])
    _write_starts(cfg, results / "t", sft_per_seed=True, base_per_seed=True)
    with pytest.raises(DataError, match="no results for 't-sft'") as err:
        build(cfg, results / "t", tmp_path / "report", reference)
    assert err.value.field == "report.stages.sft"
    for name in runs:
        _write_results(cfg, results / name, design[name])
    moved = results / "t-rl" / "eval" / "qwen2" / "gsm8k" / "MoE+IML" / "seed1.json"
    data = json.loads(moved.read_text())
    first, second = data["model"]["samples"][:2]
    first["e1"]["lenient_correct"], second["e1"]["lenient_correct"] = False, True
    moved.write_text(json.dumps(data))
    # the runs' files are the judge of what their seeds retrained: t-rl named as the SFT run is refused
    _write_starts(cfg, results / "t-sft", sft_per_seed=False, base_per_seed=False)
    with pytest.raises(DataError, match=r"'t-sft' should retrain \['sft', 'rl'\].*say \['rl'\]") as err:
        build(cfg, results / "t", tmp_path / "report", reference)
    assert err.value.field == "report.stages.sft"
    _write_starts(cfg, results / "t-sft", sft_per_seed=True, base_per_seed=False)
    _write_starts(cfg, results / "t-rl", sft_per_seed=False, base_per_seed=False)
    build(cfg, results / "t", tmp_path / "report", reference)
    table = (tmp_path / "report" / "tables" / "stages.md").read_text()
    assert _row(table, "gsm8k", "MEML-GRPO")[3:] == ["25.8", "10.5", "0.0", "83%", "17%", "0%", "13.7"]
    # test sd: MS_q = 2 (70^2 + 4 20^2 + 5 30^2) / 9 = 2444.4, MS_e = 24000 / 18 = 1333.3,
    # sqrt(((2444.4 - 1333.3) / 2 + 1333.3) / 10) = 13.7
    assert _row(table, "mathqa", "MoE-SFT-GRPO")[3:7] == ["10.5", "25.8", "0.0", "-500%"]  # noise, not clipped
    assert _row(table, "gsm8k", "MoE+HSFT")[6:9] == ["–", "–", "–"]  # no training variance to share
    assert _row(table, "gsm8k", "MoE+IML")[3:] == ["25.8", "10.5", "0.0", "83%", "33%", "-17%", "13.7"]
    # the claims' differences too: MoE-SFT-GRPO is right on q0, q1 in every seed of every run, so the seed
    # parts are MEML-GRPO's; test sd: column means 0, -50, 50 x 3, 0 x 5 (grand 10), MS_q = 2 (100 + 3600
    # + 3 1600 + 5 100) / 9 = 2000, MS_e = 24000 / 18 = 1333.3, sqrt(((2000 - 1333.3) / 2 + 1333.3) / 10) = 12.9
    assert _row(table, "gsm8k", "MEML-GRPO - MoE-SFT-GRPO")[3:] == ["25.8", "10.5", "0.0", "83%", "17%", "0%", "12.9"]
    index = (tmp_path / "report" / "index.md").read_text()
    # summed over the methods (MEML-GRPO and MoE+IML; the others have no spread): whole 1333.3,
    # pretraining 1111.1 (83%), SFT 111.1 + 222.2 (25%), RL -111.1 (-8%)
    assert "- qwen2 x gsm8k: pretraining 83%, SFT 25%, RL -8%." in index
    # the RL run named as the one that retrains SFT and RL is refused too
    too_much = _config(**{"grid.seeds_vary": ["pretrain", "sft", "rl"], "report.stages": {"rl": "t-sft"}})
    with pytest.raises(DataError, match=r"'t-sft' should retrain \['rl'\].*say \['sft', 'rl'\]") as err:
        build(too_much, results / "t", tmp_path / "report", reference)
    assert err.value.field == "report.stages.rl"
    # seeds that redraw the training data: their own worlds hold other training questions
    from meml.reporting.stages import retrained, stage_labels

    assert retrained(cfg, results / "t", "x") == ["pretrain", "sft", "rl"]
    for k, text in ((0, "q0"), (1, "q1")):
        world = results / "t" / "toy" / f"seed{k}" / "data"
        for ds in cfg["grid"]["datasets"]:
            (world / ds).mkdir(parents=True, exist_ok=True)
            (world / ds / "train.jsonl").write_text(text)
    assert retrained(cfg, results / "t", "x") == ["data", "pretrain", "sft", "rl"]
    scopes = [["data", "pretrain", "sft", "rl"], ["pretrain", "sft", "rl"], ["sft", "rl"], ["rl"]]
    assert stage_labels(scopes) == ["the training data", "pretraining", "SFT", "RL"]
    # a hub model's base is never retrained: no pretraining spread to split off
    hub = _config(**{"grid.seeds_vary": ["pretrain", "sft", "rl"], "report.stages": {"sft": "t-sft"}})
    hub["models"]["qwen2"]["source"] = "Qwen/Qwen2.5-Math-1.5B"
    with pytest.raises(DataError, match="qwen2: a hub or GGUF model's base is never retrained") as err:
        grid.check_stages(hub)
    assert err.value.field == "report.stages.sft"
    # a run whose seeds retrain RL only has nothing to split off
    rl_only = _config(**{"grid.seeds_vary": ["rl"], "report.stages": {"rl": "t-rl"}})
    with pytest.raises(DataError, match="splits nothing off it") as err:
        grid.check(rl_only, 3)  # the workflow's check when it loads the config
    assert err.value.field == "report.stages.rl"


def test_what_the_rl_stage_contributes_by_hand(built: tuple[dict, Path]) -> None:
    """The index's RL-stage table is each method's expert-1 accuracy minus its SFT start's (10%),
    paired by question: Expert1-SFT-GRPO scores 20% on both data sets and seeds, so +10 points,
    all from question 1 (right after RL, wrong before, in both seeds). Crossed seeds x questions:
    MS_seed 0, MS_question 2 x (90^2 + 9 x 10^2) / 9 = 2000, MS_error 0, so se sqrt(2000 / 20) = 10
    on 9 df (t 2.262): [-12.6, +32.6]; over the two data sets (independent cells) se sqrt(2 x 100) /
    2 on 18 df (t 2.101): [-4.9, +24.9]. MEML-GRPO: 10/20% on GSM8K (0 and +10 points), 50/60% on
    MathQA (+40, +50)."""
    _, out = built
    index = (out / "index.md").read_text()
    assert "minus that of the SFT model it started RL from" in index
    assert _row(index, "Expert1-SFT-GRPO")[1:] == ["+10.0 [-12.6, +32.6]"] * 2 + ["+10.0 [-4.9, +24.9]"]
    meml = _row(index, "MEML-GRPO")  # all: (0 + 10 + 40 + 50) / 4
    assert [c.split(" ")[0] for c in meml[1:]] == ["+5.0", "+45.0", "+25.0"]
    assert "RL raised held-out accuracy over the SFT start for MEML-GRPO" in index
    assert (out / "tables/learning.md").is_file()


def test_a_report_says_whose_models_read_the_toy_world() -> None:
    """Tiny models on the toy world: the toy-scale note; a real pretrained model on it: the
    synthetic-data note (not 'tiny models'); the real data sets: neither."""
    from meml.reporting.tables import REAL_MODEL_ON_TOY_NOTE, TOY_NOTE, scale_notes

    tiny = {"world": "toy", "grid": {"models": None}, "models": {"qwen2": {"source": "tiny:qwen2"}}}
    assert scale_notes(tiny) == [TOY_NOTE]
    gguf = {
        **tiny,
        "grid": {"models": ["smollm2"]},
        "models": {**tiny["models"], "smollm2": {"source": "gguf:x/y.gguf"}},
    }
    assert scale_notes(gguf) == [REAL_MODEL_ON_TOY_NOTE] and "tiny models" not in REAL_MODEL_ON_TOY_NOTE
    assert scale_notes({**gguf, "world": "real"}) == []
