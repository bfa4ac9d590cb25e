"""The Snakemake DAG: the whole grid on a smoke config in a temporary directory, reruns,
MLflow bookkeeping, and config errors that stop the run before any job."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PAPER_DATA_PINS, PROJECT

from meml.core.environment import weights_sha256

pytestmark = pytest.mark.slow  # `pytest -m "not slow"` for a quick round

SNAKEMAKE = [sys.executable, "-m", "snakemake"]
SMOKE = PROJECT / "config" / "smoke.yaml"
HUB_TOKEN = {"HF_TOKEN": "hf_placeholder_for_the_dry_run"}  # the gated model's token: its presence is checked
TABLES = ["main", "ablation", "majority_vote", "complementarity", "sparsity", "learning", "trl"]
# one extra method for each extra table (the open questions); five experts for the experts table
EXTRAS = ["Expert1+HSFT", "MEML-Dr.GRPO", "MEML-5experts", "MEML-per_expert", "MEML-B4", "MoE-SFT-GRPO+DS"]
EXTRA_TABLES = ["gain", "drgrpo", "experts", "compute", "sensitivity", "dynamic"]


def _run(tmp: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # `--quiet host -p`: the rule blocks and commands the tests read, which the workstation profile
    # keeps out of a user's view
    cmd = [*SNAKEMAKE, "--snakefile", str(PROJECT / "Snakefile"), "--directory", str(tmp), "--cores", "2"]
    cmd += ["--quiet", "host", "--printshellcmds", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=1200, cwd=tmp, env={**os.environ, **(env or {})})


def _job_counts(output: str) -> dict[str, int]:
    """The 'job / count' table that Snakemake prints before running (or with -n)."""
    counts: dict[str, int] = {}
    for match in re.finditer(r"^(\w+)\s+(\d+)$", output, re.M):
        if match.group(1) != "total":
            counts[match.group(1)] = int(match.group(2))
    return counts


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The whole DAG once, on one model and one data set (every rule, every table, the extras)."""
    tmp = tmp_path_factory.mktemp("dag")
    (tmp / "grid.yaml").write_text(
        "grid: {models: [qwen2], datasets: [strategyqa]}\n"
        f"extras: {{datasets: [strategyqa], methods: {json.dumps(EXTRAS)}}}\nexperts: {{count: 5}}\n"
        "eval: {sft: true}\n"  # the SFT models evaluated too: the learning table
        "trl: {methods: [Expert1-SFT-GRPO]}\n"  # and one method trained by trl's GRPOTrainer: the trl table
    )
    # on two pretend GPUs (pipeline/meml/core/gpus.py): every job that would take a GPU gets one of its own
    gpus = {"MEML_SIMULATE_GPUS": "2", "MEML_GPU_LOCKS": str(tmp / "gpu-locks")}
    done = _run(tmp, "--configfile", str(SMOKE), str(tmp / "grid.yaml"), "--resources", "gpu=2", env=gpus)
    assert done.returncode == 0, done.stderr[-4000:]
    return tmp


def test_jobs_running_together_never_share_a_gpu(smoke_run: Path) -> None:
    """The smoke grid ran with MEML_SIMULATE_GPUS=2 and --resources gpu=2: each GPU job recorded the
    device it was given; jobs that overlapped in time held different devices, both were used, and
    the RL jobs wrote theirs into their DONE."""
    records = [json.loads(x) for x in (smoke_run / "logs/smoke/gpus.jsonl").read_text().splitlines()]
    rules = {r["job"].split(" -m meml.run ")[1].split()[0] for r in records if " -m meml.run " in r["job"]}
    assert {"sft", "rl", "eval", "calibrate", "complementarity"} <= rules
    assert all(r["returncode"] == 0 for r in records)
    overlapping = 0
    for i, a in enumerate(records):
        for b in records[i + 1 :]:
            if a["start"] < b["end"] and b["start"] < a["end"]:
                overlapping += 1
                assert not set(a["devices"].split(",")) & set(b["devices"].split(",")), (a, b)
    assert overlapping > 0, "no two GPU jobs ran at once: the check proved nothing"
    assert {r["devices"] for r in records} == {"0", "1"}
    done = json.loads(next((smoke_run / "results/smoke/rl").rglob("DONE")).read_text())
    assert done["environment"]["devices"] in ("0", "1")


def test_every_table_and_figure_exists_and_parses(smoke_run: Path) -> None:
    report = smoke_run / "report/smoke"
    for name in TABLES + EXTRA_TABLES:
        rows = [line for line in (report / f"tables/{name}.md").read_text().splitlines() if line.startswith("|")]
        assert len(rows) >= 3 and len({row.count("|") for row in rows}) == 1, name
        tex = (report / f"tables/{name}.tex").read_text()
        assert tex.count(r"\begin{tabular}") == 1 and tex.count(r"\end{tabular}") == 1, name
        body = tex.split(r"\midrule")[1].split(r"\bottomrule")[0].strip().splitlines()
        assert len({line.count(" & ") for line in body}) == 1, name
    assert (report / "figures/reward_curves_strategyqa.png").stat().st_size > 1000
    assert (report / "figures/reward_curves_strategyqa.pdf").is_file()
    assert (report / "figures/complementarity_qwen2_strategyqa.png").is_file()
    assert (report / "figures/sparsity_strategyqa.png").stat().st_size > 1000
    assert "tables/main.md" in (report / "index.md").read_text()
    assert (report / "toy_stats.md").is_file()
    main = (report / "tables/main.md").read_text()
    assert all(m in main for m in ["Expert1-SFT-GRPO", "MoE-SFT-Dr.GRPO", "MEML-GRPO"]) and "Toy scale" in main
    assert "MEML-5experts" not in main  # extras stay in their own tables
    experts = (report / "tables/experts.md").read_text()
    assert "MEML-5experts" in experts and "experts 0,1,2,3,4" in experts and "MEML-GRPO" in experts
    compute = (report / "tables/compute.md").read_text()
    # one seed, 2 steps x 2 questions: G = 8 shared -> 16 rollouts a step; per expert 3 x 8 -> 48
    assert re.search(r"MEML-GRPO \|[^\n]*\| 32 \|", compute) and re.search(r"MEML-per_expert \|[^\n]*\| 96 \|", compute)
    index = (report / "index.md").read_text()
    assert "## What the numbers say" in index and "HSFT alone, on one expert, beats single-expert GRPO" in index
    # what to expect of these numbers against a committed example from another machine, and where it is explained
    assert "repeat to the bit on this machine" in index and "docs/reliability.md" in index
    # one seed: no line of the summary claims a verdict
    verdicts = re.findall(r"\*\*([^*]+)\*\*", index.split("## What the numbers say")[1].split("## Tables")[0])
    assert verdicts and all(v.startswith(("no verdict", "inconclusive")) for v in verdicts), verdicts


def test_second_invocation_does_nothing(smoke_run: Path) -> None:
    again = _run(smoke_run, "--configfile", str(SMOKE), str(smoke_run / "grid.yaml"))
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr


def test_one_mlflow_run_per_cell_with_its_id_in_the_outputs(smoke_run: Path) -> None:
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{smoke_run / 'results/mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["smoke"], output_format="list")
    keys = [r.data.tags["cell_key"] for r in runs]
    assert len(keys) == len(set(keys)) == 7 + len(EXTRAS) + 1  # the grid's and the extras' cells, the report
    cell = smoke_run / "results/smoke/rl/qwen2/strategyqa/MEML-GRPO/seed0"
    run_id = (cell / "mlflow_run_id").read_text().strip()
    assert json.loads((cell / "DONE").read_text())["mlflow_run_id"] == run_id
    evaluation = json.loads((smoke_run / "results/smoke/eval/qwen2/strategyqa/MEML-GRPO/seed0.json").read_text())
    assert evaluation["mlflow_run_id"] == run_id
    run = mlflow.get_run(run_id)
    assert "eval/expert1/lenient" in run.data.metrics and "reward/expert1" in run.data.metrics
    # accuracies in %, as the tables show them; the run's name starts with its cell
    assert run.data.metrics["eval/expert1/lenient"] == round(100 * evaluation["model"]["experts"]["e1"]["lenient"], 2)
    assert run.info.run_name == "MEML-GRPO qwen2 strategyqa seed0"
    tags = run.data.tags  # the grid's dimensions and the method's switches, for the UI's Group by
    assert (tags["method"], tags["dataset"], tags["model"], tags["seed"]) == ("MEML-GRPO", "strategyqa", "qwen2", "0")
    assert (tags["advantage"], tags["iml"], tags["hsft"], tags["world"]) == ("grpo", "true", "true", "toy")
    experiment = mlflow.get_experiment_by_name("smoke")
    assert "report/smoke/index.md" in experiment.tags["mlflow.note.content"]
    view = json.loads(experiment.tags["mlflow.sharedViewState.by-method"])  # the end message's grouped link
    assert view["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": "method"}]
    assert run.data.params["cell.method"] == "MEML-GRPO" and run.data.params["rl.steps"] == "2"
    # what the numbers depend on besides the config: the same record as the cell's DONE
    done_env = json.loads((cell / "DONE").read_text())["environment"]
    sft_model = smoke_run / "results/smoke/sft/qwen2/strategyqa/e0-e1-e2/model"
    assert done_env["start_weights_sha256"] == weights_sha256(sft_model)
    for key in ("cpu", "threads", "torch", "transformers", "start_weights_sha256"):
        assert run.data.params[f"environment.{key}"] == str(done_env[key])


def test_changing_one_method_reruns_only_its_cells(smoke_run: Path) -> None:
    changed = smoke_run / "changed.yaml"
    changed.write_text("methods:\n  MoE+IML: {advantage: drgrpo}\n")
    dry = _run(smoke_run, "-n", "--configfile", str(SMOKE), str(smoke_run / "grid.yaml"), str(changed))
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert _job_counts(dry.stdout) == {"rl": 1, "evaluate": 1, "report": 1, "all": 1}
    assert "MoE+IML" in dry.stdout


def test_changing_how_the_report_decides_reruns_only_the_report(smoke_run: Path) -> None:
    # the calibration jobs read the report section's headline expert alone, so a verdict setting (or a
    # replicate or stages run named for the report) reruns no measurement
    changed = smoke_run / "report_only.yaml"
    changed.write_text("report:\n  stats: {margin: 3.0}\n")
    dry = _run(smoke_run, "-n", "--configfile", str(SMOKE), str(smoke_run / "grid.yaml"), str(changed))
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert _job_counts(dry.stdout) == {"report": 1, "all": 1}


def _changed(value: object, key: str) -> object:
    """Another value of a run key than `value`, of its type (MLflow: a tracking server's URI)."""
    if key == "mlflow.tracking_uri":
        return "http://127.0.0.1:5999"
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value / 2
    if value is None:  # rl.vllm.enforce_eager (null: by the device), mlflow.experiment (null: the profile's)
        return True if key.endswith("enforce_eager") else "elsewhere"
    return f"{value}-elsewhere"


def test_changing_how_jobs_run_reruns_nothing(smoke_run: Path) -> None:
    """Every run key (core/config.RUN_KEYS) the finished grid's config holds, changed at once, MLflow
    pointed at a tracking server among them: the dry run lists no job. The keys reach the jobs on the
    shell line, outside the params Snakemake compares: a job that runs (forced here) gets the new values,
    so it logs to the new store."""
    from meml.core.config import load_config, run_settings

    now = run_settings(load_config(SMOKE, None))
    assert {"threads", "rl.micro_batch_tokens", "rl.vllm.gpu_memory_utilization", "rl.checkpoint_every",
            "mlflow.tracking_uri", "eval.batch_size"} <= now.keys()  # fmt: skip
    changed = {key: _changed(value, key) for key, value in now.items()}
    nested: dict = {}
    for key, value in changed.items():
        *parents, last = key.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    (smoke_run / "how_jobs_run.yaml").write_text(json.dumps(nested))
    config = ("--configfile", str(SMOKE), str(smoke_run / "grid.yaml"), str(smoke_run / "how_jobs_run.yaml"))
    dry = _run(smoke_run, "-n", *config)
    assert dry.returncode == 0 and "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-3000:]
    server = smoke_run / "server.yaml"  # the switch alone, as profiles/slurm advises it
    server.write_text("mlflow: {tracking_uri: 'http://127.0.0.1:5999', artifacts: ''}\n")
    dry = _run(smoke_run, "-n", "--configfile", str(SMOKE), str(smoke_run / "grid.yaml"), str(server))
    assert dry.returncode == 0 and "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-3000:]
    (smoke_run / "logging.yaml").write_text("mlflow: {enabled: true}\n")  # the jobs that run log, to the server
    forced = _run(smoke_run, "-n", "-p", "--forcerun", "rl", *config, str(smoke_run / "logging.yaml"))
    rl = [line for line in forced.stdout.splitlines() if " -m meml.run rl " in line]
    evaluation = [line for line in forced.stdout.splitlines() if " -m meml.run eval " in line]
    assert rl and evaluation, forced.stdout[-3000:]
    for line in rl + evaluation:
        assert "--run 'mlflow.tracking_uri=\"http://127.0.0.1:5999\"'" in line and "--run mlflow.enabled=true" in line
        assert f"OMP_NUM_THREADS={changed['threads']} " in line
    assert f"--run rl.micro_batch_tokens={changed['rl.micro_batch_tokens']}" in rl[0]
    assert f"--run eval.batch_size={changed['eval.batch_size']}" in evaluation[0]


def test_changing_one_data_sets_rl_settings_reruns_only_its_jobs(smoke_run: Path) -> None:
    """Each job of a data set gets that data set's rl_by_dataset entry alone, and always gets it: an
    entry for a data set outside the grid (mathqa) reruns nothing; the grid's own (strategyqa) reruns
    its RL cells and what reads their settings."""
    other = smoke_run / "mathqa_cap.yaml"
    other.write_text("rl_by_dataset:\n  mathqa: {max_new_tokens: 40}\n")
    dry = _run(smoke_run, "-n", "--configfile", str(SMOKE), str(smoke_run / "grid.yaml"), str(other))
    assert dry.returncode == 0 and "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-3000:]
    own = smoke_run / "strategyqa_cap.yaml"
    own.write_text("rl_by_dataset:\n  strategyqa: {max_new_tokens: 24}\n")
    dry = _run(smoke_run, "-n", "--configfile", str(SMOKE), str(smoke_run / "grid.yaml"), str(own))
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert _job_counts(dry.stdout)["rl"] == 7 + len(EXTRAS)
    assert '"rl_by_dataset": {"strategyqa": {"max_new_tokens": 24}}' in dry.stdout


def test_adding_a_model_reruns_only_its_own_jobs(smoke_run: Path) -> None:
    # each tiny model has its own job, so the first model's cells (and their numbers) are kept
    more = smoke_run / "two_models.yaml"
    more.write_text("grid: {models: [qwen2, llama]}\n")
    dry = _run(smoke_run, "-n", "--configfile", str(SMOKE), str(smoke_run / "grid.yaml"), str(more))
    assert dry.returncode == 0, dry.stderr[-3000:]
    counts = _job_counts(dry.stdout)
    assert counts["tiny_model"] == 1 and counts["rl"] == counts["evaluate"] == 7 + len(EXTRAS)
    assert "model=llama" in dry.stdout and "model=qwen2" not in dry.stdout and "folder=qwen2" not in dry.stdout


def test_one_cell_is_rerun_by_naming_its_output(smoke_run: Path) -> None:
    cell = "results/smoke/rl/qwen2/strategyqa/MoE+HSFT/seed0/DONE"
    target = "results/smoke/eval/qwen2/strategyqa/MoE+HSFT/seed0.json"
    config = ("--configfile", str(SMOKE), str(smoke_run / "grid.yaml"))
    dry = _run(smoke_run, "-n", *config, "--forcerun", cell, "--", target)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert _job_counts(dry.stdout) == {"rl": 1, "evaluate": 1}
    # the README's recipe: the cell again, its evaluation, the report rebuilt
    dry = _run(smoke_run, "-n", *config, "--forcerun", cell, "--", "report/smoke/index.md")
    assert _job_counts(dry.stdout) == {"rl": 1, "evaluate": 1, "report": 1}, dry.stdout[-2000:]


def test_a_forced_rerun_keeps_the_old_run_with_its_evaluation_and_one_active_mlflow_run(smoke_run: Path) -> None:
    """Last of the smoke_run tests: it replaces a cell."""
    import mlflow

    folder = smoke_run / "results/smoke/rl/qwen2/strategyqa/MoE+HSFT/seed0"
    evaluation = smoke_run / "results/smoke/eval/qwen2/strategyqa/MoE+HSFT/seed0.json"
    old_eval, old_run = evaluation.read_text(), (folder / "mlflow_run_id").read_text().strip()
    config = ("--configfile", str(SMOKE), str(smoke_run / "grid.yaml"))
    # a cell's output named alone: the end message says the report is behind and how to rebuild it
    done = _run(smoke_run, *config, "--forcerun", f"{folder.relative_to(smoke_run)}/DONE", "--",
                str(evaluation.relative_to(smoke_run)))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "predates the newest evaluations: rebuild it with" in done.stderr
    [aside] = (folder / "previous").iterdir()
    assert (aside / "eval.json").read_text() == old_eval  # the old evaluation, kept with its run
    assert (aside / "metrics.jsonl").is_file() and (aside / "model").is_dir() and evaluation.is_file()
    done = _run(smoke_run, *config, "--", "report/smoke/index.md")
    assert done.returncode == 0 and "Done. Report: report/smoke/index.md" in done.stderr
    mlflow.set_tracking_uri(f"sqlite:///{smoke_run / 'results/mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["smoke"], filter_string="tags.method = 'MoE+HSFT'",
                              output_format="list")  # fmt: skip
    assert len(runs) == 1 and runs[0].info.run_id != old_run  # one active run for the cell
    assert runs[0].data.tags["replaces"] == old_run
    assert mlflow.get_run(old_run).info.lifecycle_stage == "deleted"


def test_paper_config_lists_the_full_grid_offline(tmp_path: Path) -> None:
    paper = (str(PROJECT / "config/paper.yaml"), str(PAPER_DATA_PINS))
    dry = _run(tmp_path, "-n", "--configfile", *paper, env=HUB_TOKEN)
    assert dry.returncode == 0, dry.stderr[-3000:]
    counts = _job_counts(dry.stdout)
    assert counts["hub_model"] == 2  # each model at its commit, once; every stage starts from that copy
    assert "hub-model --source Qwen/Qwen2.5-Math-1.5B --revision 4a83ca6e4526a4f2da3aa259ec36c259f66b2ab2" in dry.stdout
    assert counts["rl"] == counts["evaluate"] == 2 * 3 * 7
    assert counts["sft"] == 2 * 3 * 2 and counts["prepare_real"] == 3 and counts["complementarity"] == 6
    assert counts["gold_expert"] == 3 and counts["teacher_trajectories"] == 3 * 2  # experts 1 and 2 per data set
    assert not (tmp_path / "results").exists()


def test_the_paper_dry_run_refuses_what_would_fail_after_money_is_spent(tmp_path: Path) -> None:
    """No hub token for the gated Llama, a teacher cap above RL's, two data sets without a hub commit:
    the dry run stops before the job list, one line each, naming the key; with a token, the paper's
    caps and commits it goes on."""
    longer = tmp_path / "longer.yaml"
    longer.write_text("teachers:\n  e1: {max_tokens: 3072}\n")
    no_token = {"HF_TOKEN": "", "HUGGING_FACE_HUB_TOKEN": "", "HF_HOME": str(tmp_path / "hf")}
    dry = _run(tmp_path, "-n", "--configfile", str(PROJECT / "config/paper.yaml"), str(longer), env=no_token)
    said = dry.stdout + dry.stderr
    assert dry.returncode != 0 and "fix first:" in said and "Job stats" not in said
    refused = [line.strip() for line in said.splitlines() if re.match(r"  (models|teachers|data)\.", line)]
    assert len(refused) == 4, refused
    assert refused[0].startswith("teachers.e1.max_tokens 3072 is above RL's answer cap of 2048 tokens")
    assert refused[1].startswith("data.strategyqa.hub_revision: ChilleD/StrategyQA is not pinned to a commit")
    assert refused[2].startswith("data.mathqa.hub_revision: allenai/math_qa is not pinned to a commit")
    assert refused[3].startswith("models.llama: meta-llama/Llama-3.2-1B-Instruct is gated on the hub and no hub token")
    assert "grid.seeds has 1 seed(s): the report will give no verdict" in said  # said, not refused


def test_complementarity_of_three_single_expert_models_adds_their_sft_runs(tmp_path: Path) -> None:
    reading = tmp_path / "single.yaml"
    reading.write_text("analysis:\n  complementarity: {source: single_expert}\n")
    dry = _run(tmp_path, "-n", "--configfile", str(PROJECT / "config/paper.yaml"), str(PAPER_DATA_PINS), str(reading),
               env=HUB_TOKEN)  # fmt: skip
    assert dry.returncode == 0, dry.stderr[-3000:]
    counts = _job_counts(dry.stdout)
    assert counts["sft"] == 2 * 3 * 4  # e0, e1, e2 and the MEF run e0-e1-e2, per model and data set
    assert counts["complementarity"] == 6
    assert "sft/qwen2/gsm8k/e2/model" in dry.stdout


def test_whole_chain_seeds_train_their_own_base_and_sft_models(tmp_path: Path) -> None:
    chain = tmp_path / "chain.yaml"
    chain.write_text(
        "grid: {models: [qwen2], datasets: [gsm8k], methods: [Expert1-SFT-GRPO, MEML-GRPO], seeds: [0, 1, 2], "
        "seeds_vary: [pretrain, sft, rl]}\n"
    )
    dry = _run(tmp_path, "-n", "-p", "--configfile", str(SMOKE), str(chain))
    assert dry.returncode == 0, dry.stderr[-3000:]
    counts = _job_counts(dry.stdout)
    # three bases, MEF and Expert1-SFT per seed, each calibrated; six RL cells; one complementarity (seed 0's)
    assert counts["tiny_model"] == 3 and counts["sft"] == 6 and counts["calibrate"] == 6 and counts["rl"] == 6
    assert counts["complementarity"] == 1
    for k in range(3):
        assert f"--out results/smoke/models/seed{k} --seed {k}" in dry.stdout
        assert (
            f"sft/qwen2/gsm8k/e0-e1-e2/seed{k}/DONE" in dry.stdout and f"sft/qwen2/gsm8k/e1/seed{k}/DONE" in dry.stdout
        )
    # adding a seed adds that seed's jobs only: seed 0's command lines (config included) stay the same
    chain.write_text(chain.read_text().replace("seeds: [0, 1, 2]", "seeds: [0]"))
    alone = _run(tmp_path, "-n", "-p", "--configfile", str(SMOKE), str(chain))
    assert alone.returncode == 0, alone.stderr[-3000:]

    def seed0(out: str) -> list[str]:
        return sorted(x for x in out.splitlines() if "meml.run" in x and re.search(r"--seed 0\b|/seed0\b", x))

    assert seed0(alone.stdout) == seed0(dry.stdout) and len(seed0(alone.stdout)) >= 5
    # the paper's hub models are never retrained: their SFT runs alone multiply with the seeds
    paper = tmp_path / "paper.yaml"
    paper.write_text("grid: {seeds: [0, 1], seeds_vary: [pretrain, sft, rl]}\n")
    dry = _run(tmp_path, "-n", "--configfile", str(PROJECT / "config/paper.yaml"), str(PAPER_DATA_PINS), str(paper),
               env=HUB_TOKEN)  # fmt: skip
    assert dry.returncode == 0, dry.stderr[-3000:]
    counts = _job_counts(dry.stdout)
    assert counts["sft"] == 2 * 2 * 3 * 2 and "tiny_model" not in counts and counts["rl"] == 2 * 2 * 3 * 7


def test_seeds_that_draw_their_own_world_are_evaluated_on_their_own_test_questions(tmp_path: Path) -> None:
    """grid.seeds_vary: world: seed k's evaluation, calibration and SFT evaluation read seed k's own
    world's test split; with [data, ...] every seed is evaluated on the shared world's."""
    design = tmp_path / "world.yaml"
    grid_line = "grid: {models: [qwen2], datasets: [gsm8k], methods: [MEML-GRPO], seeds: [0, 1], seeds_vary: VARY}\n"
    design.write_text(grid_line.replace("VARY", "[world, data, pretrain, sft, rl]") + "eval: {sft: true}\n")
    dry = _run(tmp_path, "-n", "-p", "--configfile", str(SMOKE), str(design))
    assert dry.returncode == 0, dry.stderr[-3000:]
    evals = [x for x in dry.stdout.splitlines() if "meml.run eval " in x]
    assert len(evals) == 4  # two cells, two SFT models
    for k in (0, 1):
        own = f"--data-root results/smoke/toy/seed{k}/data "
        assert sum(own in x for x in evals) == 2, evals
        assert any(f"calibrate --checkpoint results/smoke/sft/qwen2/gsm8k/e0-e1-e2/seed{k}/model" in x and own in x
                   for x in dry.stdout.splitlines())  # fmt: skip
    assert '"seeds_vary": ["world", "data", "pretrain", "sft", "rl"]' in dry.stdout  # the seed worlds are drawn whole
    design.write_text(grid_line.replace("VARY", "[data, pretrain, sft, rl]") + "eval: {sft: true}\n")
    shared = _run(tmp_path, "-n", "-p", "--configfile", str(SMOKE), str(design))
    assert shared.returncode == 0, shared.stderr[-3000:]
    evals = [x for x in shared.stdout.splitlines() if "meml.run eval " in x]
    assert len(evals) == 4 and all("--data-root results/smoke/toy/data " in x for x in evals), evals


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("profile: bad\ngrid: {seeds_vary: [pretrain, rl]}\n", "grid.seeds_vary"),
        ("profile: bad\ngrid: {seeds_vary: [world, sft, rl]}\n", "grid.seeds_vary"),
        ("profile: bad\ntoy:\n  sizez: {gsm8k: [30, 10]}\n", "sizez"),
        ("profile: bad\ngrid: {methods: [MEML-GRPO, MEML-GPRO]}\n", "grid.methods[1]"),
        ("profile: bad\nrl: {group_size: eight}\n", "group_size"),
    ],
)
def test_bad_config_stops_before_any_job(tmp_path: Path, text: str, named: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    done = _run(tmp_path, "--configfile", str(bad))
    assert done.returncode != 0
    assert named in done.stdout + done.stderr
    assert not (tmp_path / "results").exists()


def test_html_report_collects_every_table_with_its_caption(smoke_run: Path) -> None:
    html = smoke_run / "report.html"
    done = _run(smoke_run, "--configfile", str(SMOKE), str(smoke_run / "grid.yaml"), "--report", str(html))
    assert done.returncode == 0, done.stderr[-3000:]
    text = html.read_text()
    assert all(f"{name}.md" in text for name in TABLES + EXTRA_TABLES)


def test_the_calibration_gate_holds_rl_back_only_when_set_to_stop(tmp_path: Path) -> None:
    def feeds(gate: str) -> set[str]:
        """The rules the calibrate rule's output feeds, from Snakemake's rule graph."""
        done = subprocess.run(
            [*SNAKEMAKE, "--snakefile", str(PROJECT / "Snakefile"), "--directory", str(tmp_path),
             "--configfile", str(PROJECT / "config/smoke.yaml"), "--config", f"calibration={{gate: {gate}}}",
             "--rulegraph"],
            capture_output=True, text=True,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        ids = dict(re.findall(r'(\d+)\[label = "([\w_]+)"', done.stdout))
        calibrate = next(i for i, name in ids.items() if name == "calibrate")
        return {ids[b] for a, b in re.findall(r"(\d+) -> (\d+)", done.stdout) if a == calibrate}

    assert feeds("stop") == {"rl", "report"}
    assert feeds("warn") == {"report"}  # a warning: changing the gate's settings never retrains a cell


def test_the_gate_set_to_stop_ends_the_workflow_before_rl_with_its_message(tmp_path: Path) -> None:
    """The smoke models are far outside the informative range: with calibration.gate: stop no RL
    job starts, and the run ends by printing what is out of range and the settings that move it."""
    (tmp_path / "gate.yaml").write_text(
        "grid: {models: [qwen2], datasets: [strategyqa], methods: [MoE-SFT-GRPO]}\n"
        "calibration: {gate: stop, train_questions: 2, samples: 2, test_questions: 4}\n"
    )
    done = _run(tmp_path, "--configfile", str(SMOKE), str(tmp_path / "gate.yaml"))
    assert done.returncode != 0
    assert "calibration of qwen2/strategyqa/e0-e1-e2 (calibration.gate: stop)" in done.stderr
    assert "is outside calibration.ranges." in done.stderr and "change toy.pretrain.steps, sft.epochs" in done.stderr
    assert not list((tmp_path / "results/smoke").glob("rl/**/DONE"))
    assert not (tmp_path / "results/smoke/calibration/qwen2/strategyqa/e0-e1-e2.json").exists()


def test_a_target_naming_what_the_config_lacks_fails_before_any_job_with_the_valid_values(tmp_path: Path) -> None:
    from meml.core.io import DataError
    from meml.plan import targets

    cell = "results/toy/rl/qwen2/gsm8k/{method}/seed0/DONE"
    dry = _run(tmp_path, "-n", "--forcerun", cell.format(method="MEML-GPRO"))
    said = dry.stdout + dry.stderr  # Snakemake prints a parse error on stdout
    assert dry.returncode != 0 and "MissingRuleException" not in said
    line = next(x for x in said.splitlines() if x.startswith("target "))
    assert "unknown method 'MEML-GPRO'" in line and "MEML-GRPO" in line and "MoE-SFT-GRPO" in line
    assert _run(tmp_path, "-n", "--forcerun", cell.format(method="MEML-GRPO")).returncode == 0
    assert not (tmp_path / "results").exists()  # nothing ran

    from meml.core.config import load_config

    cfg = load_config()
    cell = "results/toy/rl/qwen2/{}/MEML-GRPO/{}/DONE"
    for target, says in [
        ("results/toy/eval/qwen3/gsm8k/MEML-GRPO/seed0.json", "unknown model 'qwen3'; this config's models: qwen2"),
        (cell.format("gsm8kk", "seed0"), "unknown data set 'gsm8kk'; the data sets: gsm8k, strategyqa"),
        (cell.format("gsm8k", "seed3"), "unknown seed 'seed3'; this config's seeds (grid.seeds): seed0"),
        ("results/smoke/rl/qwen2/gsm8k/MEML-GRPO/seed0/DONE", "profile 'smoke' is not this config's ('toy')"),
    ]:
        with pytest.raises(DataError, match=re.escape(says)):
            targets.check(cfg, [target])
    targets.check(cfg, ["results/toy/eval/llama/mathqa/MoE+IML/seed0.json", "report/toy/index.md", "all"])
    # the base and SFT models' evaluations are named by no method (eval.base, eval.sft)
    targets.check(cfg, ["results/toy/eval/qwen2/gsm8k/base.json", "results/toy/eval/qwen2/gsm8k/sft/e0-e1-e2.json",
                        "results/toy/eval/qwen2/gsm8k/sft/e1/seed2.json"])  # fmt: skip
    with pytest.raises(DataError, match=re.escape("unknown method 'sft.json'")):
        targets.check(cfg, ["results/toy/eval/qwen2/gsm8k/sft.json"])
    assert targets.named_on(["-n", "--forcerun=results/toy/x", "results/toy/y", "--cores", "2"]) == [
        "results/toy/x", "results/toy/y"]  # fmt: skip
