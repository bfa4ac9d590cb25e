"""RL's check of the trajectories' lengths as a job of its own, right after the teachers and before
SFT (rule trajectory_lengths), on config/real-smoke.yaml: the real data sets, its CPU teachers and a
tiny model whose tokenizer was trained on the real texts (its 24-token cap cuts every trajectory)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PROJECT

SHARED = PROJECT.parent / "shared" / "datasets"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/datasets (the real data sets) is not beside the project"),
]
CONFIG = PROJECT / "config" / "real-smoke.yaml"
SFT = ["results/real-smoke/sft/qwen2/gsm8k/e0-e1-e2/DONE", "results/real-smoke/sft/qwen2/gsm8k/e1/DONE"]
CHECKED = "results/real-smoke/real/lengths/qwen2/gsm8k.json"
MESSAGE = (
    "of expert 0's SFT trajectories are longer than rl.max_new_tokens = 24 tokens "
    "(allowed: rl.max_truncated_share = 5%)"
)


def _design(tmp: Path, share: float | None) -> None:
    (tmp / "design.yaml").write_text(
        "data:\n" + "".join(f"  {ds}: {{local: {SHARED / ds}}}\n" for ds in ("gsm8k", "strategyqa", "mathqa"))
        + "grid: {models: [qwen2], datasets: [gsm8k], methods: [Expert1-SFT-GRPO, MEML-GRPO]}\n"
        + (f"rl: {{max_truncated_share: {share}}}\n" if share is not None else "")
    )  # fmt: skip


def _snakemake(tmp: Path, *targets: str, standin: bool = False) -> subprocess.CompletedProcess[str]:
    head = (
        [str(PROJECT / "tests/standin_snakemake.py"), str(tmp / "standin.jsonl"), "0.5"]
        if standin
        else ["-m", "snakemake"]
    )
    cmd = [sys.executable, *head, "--snakefile", str(PROJECT / "Snakefile"), "--directory", str(tmp), "--cores", "2",
           "--quiet", "host", "--configfile", str(CONFIG), str(tmp / "design.yaml"), "--", *targets]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=1200, cwd=tmp, env=dict(os.environ))


def test_a_cap_that_cuts_the_trajectories_stops_the_run_after_the_teachers_and_before_sft(tmp_path: Path) -> None:
    """With rl.max_truncated_share 5%, the teacher stage stops at the check with RL's message and no
    SFT runs. Once SFT has run (a stand-in, on real-smoke's own share), the same cap checks again
    without retraining SFT (its input is `ancient`), and is a warning there: RL refuses the cells."""
    _design(tmp_path, 0.05)
    failed = _snakemake(tmp_path, *SFT)
    assert failed.returncode != 0
    log = (tmp_path / "logs/real-smoke/lengths/qwen2_gsm8k.log").read_text()
    assert MESSAGE in log and "Raise rl.max_new_tokens" in log, log[-2000:]
    assert (tmp_path / "results/real-smoke/real/experts/gsm8k/e2.jsonl").is_file()  # the teachers ran
    assert not (tmp_path / CHECKED).exists() and not (tmp_path / "results/real-smoke/sft").exists()

    _design(tmp_path, None)  # real-smoke's own share (1.0): the check and SFT as stand-ins
    assert _snakemake(tmp_path, *SFT, standin=True).returncode == 0
    _design(tmp_path, 0.05)
    again = _snakemake(tmp_path, *SFT)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "trajectory_lengths" in again.stdout + again.stderr and "rule sft" not in again.stdout + again.stderr
    checked = json.loads((tmp_path / CHECKED).read_text())
    assert MESSAGE in checked["error"]
    (check,) = checked["checks"]
    assert check["experts"] == [0, 1, 2] and check["max_new_tokens"] == 24
    assert set(check["over_cap"]) == {"e0", "e1", "e2"} and all(v > 0.05 for v in check["over_cap"].values())
