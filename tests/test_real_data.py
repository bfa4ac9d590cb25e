"""The checker and loaders on the real data sets in ../shared/datasets (skipped when absent)."""

from __future__ import annotations

from pathlib import Path

from meml.data.agreement import run
from meml.data.loaders import load_local


def test_real_splits(shared_datasets: Path) -> None:
    counts = {}
    for ds in ("gsm8k", "strategyqa", "mathqa"):
        records = load_local(ds, shared_datasets / ds)
        counts[ds] = (sum(r.split == "train" for r in records), sum(r.split == "test" for r in records))
    assert counts == {"gsm8k": (7473, 1319), "strategyqa": (1602, 687), "mathqa": (4475, 2985)}


def test_strategyqa_bigbench_copy_gives_the_same_split(shared_datasets: Path, tmp_path: Path) -> None:
    (tmp_path / "task.json").write_bytes((shared_datasets / "strategyqa" / "task.json").read_bytes())
    official = {(r.id, r.split, r.answer) for r in load_local("strategyqa", shared_datasets / "strategyqa")}
    bigbench = {(r.id, r.split, r.answer) for r in load_local("strategyqa", tmp_path)}
    assert official == bigbench


def test_agreement_on_real_gold_rationales(shared_datasets: Path, tmp_path: Path) -> None:
    report = run(shared_datasets, tmp_path)
    for ds in ("gsm8k", "strategyqa"):
        for split in report[ds].values():
            for mode in ("strict", "lenient"):
                assert split[mode]["own_gold_accepted"] == split["records"]
                assert split[mode]["other_gold_rejected"] == split["records"]
    for split in report["mathqa"].values():
        assert split["other_gold_rejected_strict"] == split["records"]
        # the rationales are noisy; every mismatch is listed with its reason
        assert split["final_value_matches_correct_option"] >= 0.85 * split["records"]
        assert split["rationale_letter"].get("disagrees", 0) <= 10
    listed = (tmp_path / "mathqa_value_mismatches.jsonl").read_text().count("\n")
    assert listed == sum(s["records"] - s["final_value_matches_correct_option"] for s in report["mathqa"].values())
