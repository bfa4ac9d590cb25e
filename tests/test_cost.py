"""The GPU-hour estimate: work counted from the config, checked by hand; the measured path on the
tiny model; the paper grid's estimate printed by a Snakemake dry run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PAPER_DATA_PINS, PROJECT

from meml.core.config import load_config
from meml.plan.cost import Assumptions, Throughput, estimate, rl_work, table


def _cfg() -> dict:
    return load_config(
        overrides={
            "grid.models": ["qwen2"],
            "grid.datasets": ["gsm8k"],
            "grid.methods": ["MoE-SFT-GRPO", "MEML-GRPO", "Expert1-SFT-GRPO"],
            "rl.steps": 2,
            "rl.questions_per_step": 2,
            "rl.group_size": 8,
            "rl.max_new_tokens": 32,
            "rl_by_dataset": {},  # the default's GSM8K cap of 384 would override the 32
            "eval.questions": 10,
            "eval.max_new_tokens": 32,
            "toy.sizes.gsm8k": [100, 20],
            "sft.epochs": 2,
            "analysis.complementarity.questions": 5,
            "analysis.complementarity.samples": 2,
        }
    )


A = Assumptions(prompt_tokens=100, fill=0.5, sft_tokens=50)
SPEED = {"qwen2": Throughput("test", generate=100.0, train=1000.0)}


def test_rl_work_by_hand() -> None:
    cfg = _cfg()
    # 2 steps x 2 questions x 8 rollouts = 32 rollouts of 16 tokens; trained on 100 + 16 tokens each
    assert rl_work(cfg, "MoE-SFT-GRPO", A) == (32 * 16, 32 * 116)
    assert rl_work(cfg, "MEML-GRPO", A) == (32 * 16, 32 * 116 * 1.25)  # IML's extra passes
    cfg["methods"]["MoE-SFT-GRPO"]["rl"] = {"spread": "per_expert"}
    assert rl_work(cfg, "MoE-SFT-GRPO", A)[0] == 3 * 32 * 16  # G for each of three experts
    cfg["methods"]["MoE-SFT-GRPO"]["dynamic_sampling"] = 2
    assert rl_work(cfg, "MoE-SFT-GRPO", A)[0] == 3 * 3 * 32 * 16  # at most two extra rounds
    # a budget in epochs on a data set: 0.5 x 100 questions / 2 a step = 25 steps, at its own cap
    cfg["rl_by_dataset"] = {"gsm8k": {"epochs": 0.5, "max_new_tokens": 64}}
    assert rl_work(cfg, "MEML-GRPO", A, "gsm8k")[0] == 25 * 2 * 8 * 32  # 400 rollouts of 32 tokens


def test_estimate_by_hand() -> None:
    rows = estimate(_cfg(), SPEED, A)
    cell = next(r for r in rows if r["method"] == "MoE-SFT-GRPO")
    # 512 / 100 + 3712 / 1000 s of RL, 10 questions x 3 experts x 16 tokens / 100 s of evaluation
    assert cell["hours"] == pytest.approx((5.12 + 3.712 + 4.8) / 3600)
    expert1 = next(r for r in rows if r["method"] == "Expert1-SFT-GRPO")
    assert expert1["hours"] == pytest.approx((5.12 + 3.712 + 1.6) / 3600)  # one evaluated expert
    sft = {r["method"]: r["hours"] for r in rows if r["stage"] == "sft"}
    # 100 questions x experts x 2 epochs x 50 tokens / 1000 tokens/s
    assert sft == {"e0-e1-e2": pytest.approx(30 / 3600), "e1": pytest.approx(10 / 3600)}
    comp = next(r for r in rows if r["stage"] == "complementarity")
    assert comp["hours"] == pytest.approx(5 * 3 * 2 * 16 / 100 / 3600)
    text = table(rows, SPEED)
    assert f"**{sum(r['hours'] for r in rows):.3g}**" in text and "| rl+eval | qwen2 | gsm8k | MEML-GRPO |" in text


@pytest.mark.slow
def test_measured_throughput_is_kept_for_later_estimates(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "meml.cli", "cost", "--config", str(PROJECT / "config/smoke.yaml"),
           "--set", "grid.models=[qwen2]", "--results", str(tmp_path)]  # fmt: skip
    measured = subprocess.run([*cmd, "--measure", "--steps", "2"], capture_output=True, text=True, timeout=600)
    assert measured.returncode == 0, measured.stderr[-3000:]
    assert (tmp_path / "cost_throughput.json").is_file()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert "qwen2: measured on" in again.stdout and "| **total** | grid |" in again.stdout


def test_paper_dry_run_prints_the_estimate(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "snakemake", "-n", "--snakefile", str(PROJECT / "Snakefile"), "--directory",
           str(tmp_path), "--configfile", str(PROJECT / "config/paper.yaml"), str(PAPER_DATA_PINS)]  # fmt: skip
    env = {**os.environ, "HF_TOKEN": "hf_placeholder"}  # the gated model's token: only its presence is checked
    dry = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "Estimated GPU-hours of this grid: " in dry.stderr and "assumed H100" in dry.stderr
    # what the run needs, and the estimate with both engines, before the job list and again last
    assert "[rl.engine: vllm, this config]" in dry.stderr and "With rl.engine: hf instead: " in dry.stderr
    assert "MISSING: device cuda: 0 GPU(s) here" in dry.stderr and "Before this run (" in dry.stderr
    assert "Not counted: the padding of the update's passes" in dry.stderr
    tail = dry.stderr.rstrip().splitlines()[-3:]
    assert tail[-1].startswith("With rl.engine: hf instead: ") and tail[-2].startswith("Estimated GPU-hours"), tail


def test_preflight_names_what_a_real_run_lacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from meml.core.config import load_config
    from meml.plan.preflight import block, needs

    cfg = load_config(PROJECT / "config/paper.yaml")
    monkeypatch.delenv("DEEPSEEK_API_KEY", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    cfg["data"]["gsm8k"]["local"] = str(tmp_path)  # a folder that is there
    cfg["data"]["mathqa"]["local"] = str(tmp_path / "nowhere")
    lines = needs(cfg)
    assert "MISSING: teachers.e1: the API key's environment variable DEEPSEEK_API_KEY is not set" in lines
    assert f"ok: data.gsm8k.local: {tmp_path}" in lines
    assert f"MISSING: data.mathqa.local: {tmp_path / 'nowhere'} is not a folder" in lines
    assert any(line.startswith("MISSING: data.strategyqa: ChilleD/StrategyQA") for line in lines)  # offline, uncached
    assert any(line.startswith("MISSING: models.qwen2: Qwen/Qwen2.5-Math-1.5B") for line in lines)
    assert "MISSING: device cuda: 0 GPU(s) here, 1 a job (a cluster profile gives jobs their own)" in lines
    monkeypatch.setenv("DEEPSEEK_API_KEY", "k")
    assert not any("DEEPSEEK_API_KEY" in line for line in needs(cfg))
    assert block(cfg, ["estimate"]).startswith("Before this run (") and block(cfg, ["estimate"]).endswith("estimate")
    assert needs(load_config()) == []  # the toy world on a CPU needs nothing


def test_teachers_and_complementarity_are_priced_where_they_run() -> None:
    """The paper's two paid teachers: 38,912 training questions each (GSM8K, StrategyQA and MathQA's
    train splits), 1 / 0.7 tries, 0.6 x 2,048 tokens, at 30 tokens/s a request and 8 in flight.
    Complementarity samples on the GPU through rl.engine's engine there (vLLM under vllm, transformers'
    generate otherwise), and is priced at that engine's rate."""
    from meml.plan.cost import Assumptions, assumed_h100, estimate, stage_engines, teacher_lines, throughputs

    cfg = load_config(PROJECT / "config/paper.yaml")
    lines = teacher_lines(cfg)
    assert len(lines) == 2 and "38,912 training questions x 1.4 tries" in lines[0]
    hours = 38_912 / 0.7 * 0.6 * 2048 / 30 / 3600 / 8
    assert f"about {hours:.0f} h of API time at concurrency 8" in lines[0]
    a = Assumptions()
    for engine in ("vllm", "hf"):
        changed = {**cfg, "rl": {**cfg["rl"], "engine": engine}}
        rows = [r for r in estimate(changed, throughputs(changed), a) if r["stage"] == "complementarity"]
        qwen = next(r for r in rows if r["model"] == "qwen2" and r["dataset"] == "gsm8k")
        tokens = 1319 * 3 * 8 * a.fill * 2048
        rate = assumed_h100("Qwen/Qwen2.5-Math-1.5B", engine).generate
        assert qwen["hours"] == pytest.approx(tokens / rate / 3600)
    # rl.engine kv on a GPU: the sampling jobs use transformers' generate there, priced as hf
    kv = {**cfg, "rl": {**cfg["rl"], "engine": "kv"}}
    assert stage_engines(kv) == {"rl": "kv", "evaluation": "vllm", "calibration": "hf", "complementarity": "hf"}


def test_the_estimate_names_what_it_leaves_out(tmp_path: Path) -> None:
    """Beside its hours the estimate says what they count (tokens at 40% of the H100's peak when
    assumed) and what they do not: padding, and the start-up of every GPU job, counted by hand from
    the grid (an RL and an evaluation job a cell, one job an SFT variant and a complementarity pair)."""
    from meml.plan.cost import JOB_OVERHEAD_MINUTES, terms
    from meml.plan.grid import cells, complementarity_models, sft_variant

    cfg = load_config(PROJECT / "config/paper.yaml")
    grid = cells(cfg)
    variants = {(c.model, c.dataset, sft_variant(cfg["methods"][c.method]["sft_experts"])) for c in grid}
    pairs = len(complementarity_models(cfg)) * len(cfg["grid"]["datasets"])
    jobs = 2 * len(grid) + len(variants) + pairs
    line = terms(cfg, tmp_path / "none.json")
    assert "40% of the H100's dense bf16 peak" in line and "Not counted: the padding" in line
    hours = jobs * JOB_OVERHEAD_MINUTES / 60
    assert f"up to {JOB_OVERHEAD_MINUTES} min x {jobs} GPU jobs = {hours:.0f} GPU-hours more" in line


def test_evaluation_is_priced_at_its_own_backend() -> None:
    """Evaluation runs on eval.backend, whatever rl.engine is: vLLM's rate for the paper config's
    evaluation even with rl.engine hf, generate's rate with eval.backend hf under rl.engine vllm."""
    from meml.plan.cost import assumed_h100, sampling_rate, throughputs

    paper = load_config(PROJECT / "config/paper.yaml")
    for rl_engine, backend in (("hf", "vllm"), ("vllm", "hf")):
        cfg = {**paper, "rl": {**paper["rl"], "engine": rl_engine}, "eval": {**paper["eval"], "backend": backend}}
        t = throughputs(cfg)["qwen2"]
        want = assumed_h100("Qwen/Qwen2.5-Math-1.5B", backend).generate
        assert sampling_rate(cfg, "qwen2", t, backend) == want != t.generate


def test_slurm_runtimes_by_hand_and_in_the_profile() -> None:
    """The longest job of each rule, doubled, plus 10 minutes, in half hours; profiles/slurm asks for
    what `meml cost --slurm` says of the paper's grid at the assumed H100 throughputs."""
    import yaml

    from meml.plan.cost import slurm_runtimes, throughputs

    paper = load_config(PROJECT / "config/paper.yaml")
    minutes = slurm_runtimes(paper, throughputs(paper))
    # SFT's longest job: MathQA's 29,837 questions x 3 experts x 1 epoch x 900 tokens on Qwen2.5-1.5B
    # at 0.4 x 989e12 / (8 x 1.54e9) = 32,110 tokens/s: 2,509 s = 41.8 min; x 2 + 10 = 93.6 -> 120
    assert minutes["sft"] == 120
    # by hand on the small grid: evaluation 10 questions x 1 expert x 0.5 x 32 tokens at 100 tokens/s
    # = 1.6 s, so 0.05 min + 10 -> 30 (the floor a half hour gives)
    assert slurm_runtimes(_cfg(), SPEED, a=A)["evaluate"] == 30
    profile = yaml.safe_load((PROJECT / "profiles/slurm/config.yaml").read_text())["set-resources"]
    assert {rule: profile[rule]["runtime"] for rule in minutes} == minutes
    assert set(profile) == set(minutes), "every GPU rule has a runtime from the estimate"
