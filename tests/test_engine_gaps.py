"""reporting/engine_gaps.py: the sampler and weight-sync gaps of every step, summed up by hand."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import PROJECT  # noqa: F401  (the package on the path)

from meml.core.config import load_config
from meml.plan import grid
from meml.plan.layout import Layout
from meml.reporting.engine_gaps import gaps_figure, gaps_table, logged
from meml.reporting.results import Results


def _cfg() -> dict:
    return load_config(overrides={"profile": "t", "grid.models": ["qwen2"], "grid.datasets": ["gsm8k"],
                                  "grid.methods": ["Expert1-SFT-GRPO", "MEML-GRPO"], "grid.seeds": [0],
                                  "mlflow.enabled": False})  # fmt: skip


def _write(root: Path, cell: grid.Cell, rows: list[dict]) -> None:
    """The cell's step metrics, and an evaluation (Results reads one for every cell)."""
    evaluation = Layout(root).eval(cell)
    evaluation.parent.mkdir(parents=True, exist_ok=True)
    evaluation.write_text(json.dumps({"model": {"experts": {}, "samples": []}}))
    folder = Layout(root).rl(cell)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_table_sums_up_every_step_and_the_syncs_drift(tmp_path: Path) -> None:
    """24 steps: sampler mean 1e-6 on even steps, 3e-6 on odd (average 2e-6), largest 5e-5 at step
    7; the sync gap 1e-5 on the first 10 steps, 4e-5 on the last 10 (a drift the table shows), 2e-5
    between. MEML-GRPO's cell logged neither: it is left out."""
    cfg = _cfg()
    rows = []
    for step in range(24):
        sync = 1e-5 if step < 10 else (4e-5 if step >= 14 else 2e-5)
        rows.append({"step": step, "reward/mean": 0.5, "sampler_gap/mean": 1e-6 if step % 2 == 0 else 3e-6,
                     "sampler_gap/max": 5e-5 if step == 7 else 1e-5, "sync/logprob_gap": sync})  # fmt: skip
    _write(tmp_path, grid.Cell("qwen2", "gsm8k", "Expert1-SFT-GRPO", 0), rows)
    _write(tmp_path, grid.Cell("qwen2", "gsm8k", "MEML-GRPO", 0), [{"step": 0, "reward/mean": 0.5}])
    found = logged(cfg, Results(cfg, tmp_path))
    assert [cell.method for cell, _ in found] == ["Expert1-SFT-GRPO"]
    table, lines = gaps_table(cfg, found)
    (row,) = table.rows
    assert row[2] == "Expert1-SFT-GRPO (seed 0)"
    assert row[3:] == ["24", "2.0e-06", "5.0e-05", "24", "1.0e-05", "4.0e-05", "1.0e-05 -> 4.0e-05"]
    assert lines == [
        "- qwen2/gsm8k/Expert1-SFT-GRPO seed 0: the sampler's log-probs against the learner's, over 24 steps: "
        "2.0e-06 on average, 5.0e-05 at most; the weight sync's probe gap 1.0e-05 to 4.0e-05 over 24 syncs "
        "(first 10 1.0e-05, last 10 4.0e-05)."
    ]
    files = gaps_figure(cfg, found, tmp_path)
    assert [f.name for f in files] == ["engine_gaps.png", "engine_gaps.pdf"] and files[0].stat().st_size > 1000


def test_an_engine_without_a_sync_check_shows_the_sampler_gap_alone(tmp_path: Path) -> None:
    """The policy module samples itself (no weights of its own to sync): a dash for the sync; a short
    run's drift compares its halves."""
    cfg = _cfg()
    rows = [{"step": s, "reward/mean": 0.5, "sampler_gap/mean": 2e-6, "sampler_gap/max": 8e-6} for s in range(3)]
    _write(tmp_path, grid.Cell("qwen2", "gsm8k", "MEML-GRPO", 0), rows)
    _write(tmp_path, grid.Cell("qwen2", "gsm8k", "Expert1-SFT-GRPO", 0), [{"step": 0, "reward/mean": 0.5}])
    found = logged(cfg, Results(cfg, tmp_path))
    table, lines = gaps_table(cfg, found)
    assert table.rows[0][3:] == ["3", "2.0e-06", "8.0e-06", "–", "–", "–", "–"]
    assert lines[0].endswith("over 3 steps: 2.0e-06 on average, 8.0e-06 at most.")
