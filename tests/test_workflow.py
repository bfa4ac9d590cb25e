"""The Snakemake DAG on a smoke config, in a temporary directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import PROJECT

SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def _run(tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [*SNAKEMAKE, "--snakefile", str(PROJECT / "Snakefile"), "--directory", str(tmp), "--cores", "1", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp)


def test_smoke_dag_produces_its_outputs(tmp_path: Path) -> None:
    smoke = tmp_path / "smoke.yaml"
    smoke.write_text(
        "profile: smoke\ntoy:\n  sizes: {gsm8k: [30, 10], strategyqa: [30, 10], mathqa: [30, 10]}\n  vocab_size: 400\n"
    )
    done = _run(tmp_path, "--configfile", str(smoke))
    assert done.returncode == 0, done.stderr[-3000:]
    stats = json.loads((tmp_path / "report/smoke/toy_stats.json").read_text())
    assert {ds: (s["train"], s["test"]) for ds, s in stats.items()} == {
        "gsm8k": (30, 10),
        "strategyqa": (30, 10),
        "mathqa": (30, 10),
    }
    assert (tmp_path / "results/smoke/models/qwen2/model.safetensors").is_file()
    again = _run(tmp_path, "--configfile", str(smoke))
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr


def test_misspelt_key_stops_before_any_job(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("profile: bad\ntoy:\n  sizez: {gsm8k: [30, 10]}\n")
    done = _run(tmp_path, "--configfile", str(bad))
    assert done.returncode != 0
    assert "sizez" in done.stdout + done.stderr
    assert not (tmp_path / "results").exists()
