"""reporting/learning.py: each cell against the SFT model it started from, paired by question."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from conftest import PROJECT  # noqa: F401  (the package on the path)

from meml.core.config import load_config
from meml.core.io import DataError
from meml.plan import grid
from meml.plan.layout import Layout
from meml.reporting.learning import gain, learning_table
from meml.reporting.results import Results

# one seed, 4 test questions; expert 1 right on these questions
RL = {"e0": [1, 1, 0, 0], "e1": [1, 1, 1, 0]}
SFT = {"e0": [0, 1, 0, 0], "e1": [1, 0, 1, 0], "e2": [0, 0, 0, 0]}


def _block(correct: dict[str, list[int]]) -> dict:
    """Gold "1"; expert k's wrong answer is 3k (so wrong answers never agree). The stored vote is
    right on question 0 only, whoever voted."""
    samples = []
    for q in range(4):
        row: dict = {"id": f"q{q}", "gold": "1", "majority_vote_lenient": "1" if q == 0 else "2"}
        for expert, right in correct.items():
            answer = "1" if right[q] else str(3 * int(expert[1:]))
            row[expert] = {"lenient": answer, "lenient_correct": bool(right[q]), "strict_correct": False}
        samples.append(row)
    return {"model": {"experts": {e: {"lenient": sum(v) / 4} for e, v in correct.items()}, "samples": samples}}


@pytest.fixture
def world(tmp_path: Path) -> tuple[dict, Path]:
    cfg = load_config(overrides={"profile": "t", "grid.models": ["qwen2"], "grid.datasets": ["gsm8k"],
                                 "grid.methods": ["Expert1-SFT-GRPO", "MEML-GRPO"], "grid.seeds": [0],
                                 "eval.sft": True, "mlflow.enabled": False})  # fmt: skip
    layout = Layout(tmp_path)
    for cell in grid.cells(cfg):
        experts = [f"e{k}" for k in grid.eval_experts(cfg, cell.method)]
        path = layout.eval(cell)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_block({e: RL.get(e, [0, 0, 0, 0]) for e in experts})))
    for model, ds, variant in grid.calibrated(cfg):
        path = layout.eval_sft(model, ds, variant)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_block(SFT)))
    return cfg, tmp_path


def test_the_gain_is_the_paired_difference_with_its_interval(world: tuple[dict, Path]) -> None:
    cfg, root = world
    results = Results(cfg, root)
    # expert 1: differences 0, +1, 0, 0 -> mean 25 points; sd of (0, 100, 0, 0) = 50, se = 25, df 3
    est = gain(results, "qwen2", "gsm8k", "MEML-GRPO", "e1")
    assert est.mean == 25.0 and est.se == 25.0 and est.df == 3.0
    low, high = est.interval(0.95)
    assert math.isclose(high - 25.0, 25.0 * 3.182446305284263, rel_tol=1e-9) and math.isclose(low, 25 - (high - 25))
    # expert 0: +1, 0, 0, 0 -> also 25; expert 2 (RL all wrong, SFT all wrong): 0 with se 0
    assert gain(results, "qwen2", "gsm8k", "MEML-GRPO", "e0").mean == 25.0
    assert gain(results, "qwen2", "gsm8k", "MEML-GRPO", "e2").mean == 0.0


def test_the_table_shows_each_expert_and_the_vote(world: tuple[dict, Path]) -> None:
    cfg, root = world
    table, records = learning_table(cfg, Results(cfg, root))
    assert [row[2] for row in table.rows] == ["Expert1-SFT-GRPO", "MEML-GRPO"]
    expert1_only, meml = table.rows
    assert expert1_only[3:] == ["–", "75.0 (+25.0 [-54.6, +104.6])", "–", "–"]  # one expert: no vote
    assert meml[3] == "50.0 (+25.0 [-54.6, +104.6])"
    assert meml[5] == "0.0 (+0.0 [+0.0, +0.0])"  # the same answers on every question
    # the vote: the cell's stored one is right on q0 only; its SFT start's is recomputed among the
    # cell's voters e0-e2, not read from the file: q0 e0 "0", e1 "1", e2 "6" -> a tie, e0's "0" wrong;
    # q1 "1", "3", "6" -> "1" right; q2 like q0; q3 wrong: differences +1, -1, 0, 0
    est = gain(Results(cfg, root), "qwen2", "gsm8k", "MEML-GRPO", "vote")
    assert est.mean == 0.0 and math.isclose(est.se, math.sqrt(20000 / 3) / 2)
    assert meml[6].startswith("25.0 (+0.0 [-129.9, +129.9])")
    assert "one seed" in table.notes[0]
    # the records the table shows (tables/learning.json): GSM8K's chance is 0 points
    meml_e1 = next(r for r in records if (r["method"], r["expert"]) == ("MEML-GRPO", "e1"))
    assert (meml_e1["accuracy"], meml_e1["sft_accuracy"], meml_e1["difference"]) == (75.0, 50.0, 25.0)
    # 25 -+ 25 x t(0.975, 3)
    assert (meml_e1["low"], meml_e1["high"], meml_e1["questions"], meml_e1["chance"]) == (-54.56, 104.56, 4, 0.0)
    assert [r["expert"] for r in records if r["method"] == "Expert1-SFT-GRPO"] == ["e1"]
    assert "GSM8K 0.0" in table.notes[1]


def test_a_missing_sft_evaluation_names_its_file(world: tuple[dict, Path]) -> None:
    cfg, root = world
    for path in (root / "eval/qwen2/gsm8k/sft").glob("*.json"):
        path.unlink()
    with pytest.raises(DataError, match=r"eval\.sft: true"):
        gain(Results(cfg, root), "qwen2", "gsm8k", "MEML-GRPO", "e1")


def test_what_the_rl_stage_contributes_is_the_held_out_change_over_the_sft_start(world: tuple[dict, Path]) -> None:
    """The index's RL-stage table: each method's expert-1 accuracy minus its SFT start's, paired by
    question (one seed): RL right on q0-q2, SFT on q0 and q2, so +25 points, se 25 on 3 df for both
    methods (every cell holds the same answers); the interval reaches 0: no clear change. The SFT
    starts' headroom comes from the calibration files (pass@1 against pass@k on held-out questions)."""
    from meml.core.io import atomic_write_json
    from meml.reporting.rl_stage import edge_steps, rl_stage_lines

    cfg, root = world
    assert (edge_steps(10), edge_steps(30), edge_steps(60), edge_steps(4)) == (3, 3, 6, 2)
    est = gain(Results(cfg, root), "qwen2", "gsm8k", "Expert1-SFT-GRPO", "e1")
    low, high = est.interval(0.95)
    for model, ds, run in grid.calibrated(cfg):
        single = run.split("/")[0] == "e1"
        heldout = {"k": 8, "pass_at_1": 0.2 if single else 0.3, "pass_at_k": 0.5 if single else 0.7}
        atomic_write_json(Layout(root).calibration(model, ds, run), {"greedy": {"accuracy": 0.25}, "heldout": heldout})
    lines = rl_stage_lines(cfg, Results(cfg, root), root)
    assert "one seed: paired over the test questions alone" in lines[0]
    cell = f"+25.0 [{low:+.1f}, {high:+.1f}]"
    assert f"| Expert1-SFT-GRPO | {cell} | {cell} |" in lines and f"| MEML-GRPO | {cell} | {cell} |" in lines
    assert "no clear change (the interval reaches 0) for Expert1-SFT-GRPO, MEML-GRPO (over all data sets)." in lines
    headroom = next(line for line in lines if line.startswith("The SFT starts' headroom"))
    assert "gsm8k e1: greedy 25.0, pass@1 20.0, pass@8 50.0" in headroom
    assert "gsm8k e0-e1-e2: greedy 25.0, pass@1 30.0, pass@8 70.0" in headroom
    # without the SFT models' evaluations there is nothing to pair: the section says so
    assert "not measured (eval.sft: false)" in rl_stage_lines({**cfg, "eval": {**cfg["eval"], "sft": False}},
                                                              Results(cfg, root), root)[0]  # fmt: skip


def test_ours_against_trl_by_hand(world: tuple[dict, Path], tmp_path: Path) -> None:
    """Step times after the first: ours 2, 4, 6 s (median 4), trl's 8, 8, 12 (median 8): ours 2.00x
    faster. Completion tokens per second of a step: 10 tokens x (2 questions x 8 rollouts) / seconds.
    Held-out, expert 1: ours right on q0-q2 (RL), trl's on q0 only: +50 points paired by question.
    Reward by step, ours 0, .1, .2, .3 and trl's 0, .05, .1, .15; 4 steps take 2 at each end: ours
    (20 + 30)/2 - (0 + 10)/2 = +20 points, each end's variance 50, so Welch's SE sqrt(50/2 + 50/2),
    2 degrees of freedom; trl's (10 + 15)/2 - (0 + 5)/2 = +10, each end's variance 12.5, SE sqrt(12.5)."""
    from meml.reporting.trl_table import trl_comparison

    cfg, root = world
    cfg = {**cfg, "trl": {"methods": ["Expert1-SFT-GRPO"], "vllm": False}}
    cell = grid.Cell("qwen2", "gsm8k", "Expert1-SFT-GRPO", 0)
    layout = Layout(root)
    for folder, seconds, rise in ((layout.rl(cell), [10, 2, 4, 6], 0.1), (layout.trl(cell), [10, 8, 8, 12], 0.05)):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "metrics.jsonl").write_text("".join(
            json.dumps({"step": i, "reward/mean": rise * i, "perf/step_seconds": s, "completion/length_mean": 10.0})
            + "\n" for i, s in enumerate(seconds)))  # fmt: skip
    (layout.trl(cell) / "eval.json").write_text(json.dumps(_block({"e1": [1, 0, 0, 0]})))
    table, files, lines, records = trl_comparison(cfg, Results(cfg, root), tmp_path)
    rl = grid.cell_values(cfg, cell)["rl"]
    rollouts = rl["questions_per_step"] * rl["group_size"]
    ours_rate = statistics.fmean(10 * rollouts / s for s in (2, 4, 6))
    trl_rate = statistics.fmean(10 * rollouts / s for s in (8, 8, 12))
    row = table.rows[0]
    t = 4.302653  # Student's t, 97.5% quantile, 2 degrees of freedom (a printed table's 4.303)
    ours_change = f"+20.0 [{20 - t * math.sqrt(50):+.1f}, {20 + t * math.sqrt(50):+.1f}]"
    trl_change = f"+10.0 [{10 - t * math.sqrt(12.5):+.1f}, {10 + t * math.sqrt(12.5):+.1f}]"
    assert row[3:11] == ["4.0", f"{ours_rate:.0f}", ours_change, "75.0", "8.0", f"{trl_rate:.0f}", trl_change, "25.0"]
    assert row[11].startswith("+50.0 [") and row[12] == "ours 2.00x faster"
    assert lines[0].startswith("- qwen2/gsm8k/Expert1-SFT-GRPO seed 0: our loop is the faster, 2.00x by median")
    stem = "trl_qwen2_gsm8k_Expert1-SFT-GRPO_seed0"
    assert [f.name for f in files] == [f"{stem}.png", f"{stem}.pdf"] and files[0].stat().st_size > 1000
    (record,) = records  # what the README's line on a real model reads
    assert record["step_seconds"] == {"ours": 4.0, "trl": 8.0} and record["faster"] == "ours" and record["ratio"] == 2.0
    assert record["accuracy"] == {"ours": 75.0, "trl": 25.0} and record["difference"] == 50.0
    assert record["low"] < 50.0 < record["high"] and record["steps"] == {"ours": 4, "trl": 4}
    assert record["reward_change"]["ours"] == {
        "mean": 20.0,
        "low": round(20 - t * math.sqrt(50), 2),
        "high": round(20 + t * math.sqrt(50), 2),
    }
    assert record["reward_change"]["trl"]["mean"] == 10.0
    assert record["engines"] == {"ours": grid.cell_values(cfg, cell)["rl"]["engine"], "trl": "transformers"}
    assert lines[0].endswith(f"training reward, last steps minus first, ours {ours_change}, trl's {trl_change}.")


def test_a_strategyqa_chance_is_its_larger_answer_class(world: tuple[dict, Path]) -> None:
    """Gold answers yes, yes, yes, no: a constant 'yes' scores 75 points."""
    cfg, root = world
    results = Results(cfg, root)
    golds = [{"gold": g} for g in ("yes", "yes", "yes", "no")]
    results.evals[("qwen2", "strategyqa", "MEML-GRPO")] = [{"samples": golds}]
    assert results.chance("qwen2", "strategyqa", "MEML-GRPO") == 75.0
    assert results.chance("qwen2", "mathqa", "MEML-GRPO") == 20.0
    assert results.chance("qwen2", "gsm8k", "MEML-GRPO") == 0.0


def test_a_reward_change_too_short_to_measure_is_null_in_trl_json() -> None:
    """One step leaves no edge steps: no mean and no interval, written as JSON nulls (JSON has no NaN)."""
    from meml.reporting.rl_stage import edge_change
    from meml.reporting.trl_table import _change_record

    record = _change_record(edge_change([0.5]), 0.95)
    assert json.dumps(record, allow_nan=False) == '{"mean": null, "low": null, "high": null}'
    assert _change_record(edge_change([0.0, 0.5]), 0.95) == {"mean": 50.0, "low": None, "high": None}
