"""The cluster path for real: the DAG through a one-node SLURM (scripts/local-cluster.sh, with
slurmdbd accounting) and MLflow on a tracking server backed by PostgreSQL, then three faults on
one RL job: `scancel`, the node daemon killed and restarted, the MLflow server down for a while.

Needs root, Linux and the Debian packages (installed by the script through apt-get when missing)
and the `cluster` extra (SLURM executor plugin, psycopg2). Skips, saying why, where the cluster
cannot start; a cluster already running is used and left running, one this module starts is
stopped at its end. MEML_CLUSTER_OUTAGE_S sets the MLflow outage (default 60 s).

MEML_CLUSTER_TESTS chooses how much runs: unset or `off`, nothing (what CI does: the cluster and
the DAG through it took 3.5-6 min here with the node to themselves, the faults 11 more, and CI has
~8 min of room under its 25); `dag`, the cluster and the DAG through it; `all`, the faults and the
GPU request too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import PROJECT

pytestmark = pytest.mark.slow
LEVEL = os.environ.get("MEML_CLUSTER_TESTS", "off")
faults = pytest.mark.skipif(LEVEL != "all", reason="the cluster fault tests run with MEML_CLUSTER_TESTS=all")

SCRIPT = PROJECT / "scripts" / "local-cluster.sh"
PROFILE = PROJECT / "profiles" / "slurm-local"
SMOKE = PROJECT / "config" / "smoke.yaml"
STATE = Path(os.environ.get("MEML_CLUSTER_STATE", "/var/tmp/meml-local-cluster"))
MLFLOW_URI = "http://127.0.0.1:15000"
CELL = "results/smoke/rl/qwen2/gsm8k/MEML-GRPO/seed0"
COMMENT = "rule_rl_wildcards_qwen2_gsm8k_MEML-GRPO_0"  # the plugin's --comment for that RL job


def _cluster(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MEML_PYTHON": sys.executable}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def cluster() -> object:
    if LEVEL not in ("dag", "all"):
        pytest.skip("the cluster tests take 6-15 minutes: MEML_CLUSTER_TESTS=dag (or all, with the faults) runs them")
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("the local cluster needs root on Linux (its daemons run as root)")
    for module, why in (("snakemake_executor_plugin_slurm", "the SLURM executor"), ("psycopg2", "PostgreSQL")):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} ({why}) is not installed: pip install -e '.[cluster]'")
    running = _cluster("status").returncode == 0
    if not running:
        started = _cluster("start")
        if started.returncode == 3:  # the script's "packages cannot be had here"
            pytest.skip(f"the local cluster cannot be installed here: {started.stderr.strip()[-300:]}")
        if started.returncode != 0:
            _cluster("stop")
            pytest.fail(f"scripts/local-cluster.sh start failed:\n{started.stdout[-2000:]}\n{started.stderr[-2000:]}")
    yield
    if not running:
        stopped = _cluster("stop")
        assert _cluster("status").returncode != 0, stopped.stdout


def _snakemake(folder: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "snakemake", "--snakefile", str(PROJECT / "Snakefile"), "--directory", str(folder),
        "--workflow-profile", str(PROFILE), "--configfile", str(SMOKE), str(folder / "grid.yaml"), *extra,
    ]  # fmt: skip


def _env() -> dict[str, str]:
    # the jobs import this checkout's package (sbatch passes the environment on: --export=ALL)
    return {**os.environ, "PYTHONPATH": str(PROJECT / "pipeline")}


def _run(folder: Path, *extra: str, timeout: float = 2400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_snakemake(folder, *extra), capture_output=True, text=True, timeout=timeout, env=_env())


def _sacct(*args: str, steps: bool = False) -> list[list[str]]:
    """sacct's rows (jobs; with `steps`, their steps too), fields split."""
    cmd = ["sacct", "-n", "--parsable2", "-S", "now-1days", *([] if steps else ["-X"]), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return [line.split("|") for line in out.splitlines() if line]


def _seconds(value: str) -> float:
    """sacct's TotalCPU ('01:34.651', '1:02:03', '1-02:03:04', '') in seconds."""
    if not value:
        return 0.0
    days, _, clock = value.rpartition("-")
    seconds = 0.0
    for part in clock.split(":"):
        seconds = seconds * 60 + float(part)
    return seconds + 86400 * int(days or 0)


def _mlflow_runs(experiment: str = "smoke") -> list[object]:
    import mlflow

    mlflow.set_tracking_uri(MLFLOW_URI)
    return mlflow.search_runs(experiment_names=[experiment], output_format="list", max_results=5000)


@pytest.fixture(scope="module")
def dag(cluster: object, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, float]:
    """A small grid (one model, one data set, two methods: 13 jobs) through SLURM, from a clean
    experiment on the server; each job a SLURM job."""
    folder = tmp_path_factory.mktemp("slurm-dag")
    (folder / "grid.yaml").write_text(
        "grid: {models: [qwen2], datasets: [gsm8k], methods: [MoE-SFT-GRPO, MEML-GRPO]}\n"
        f"mlflow: {{experiment: cluster-test-{int(time.time())}}}\n"
    )
    start = time.time()
    done = _run(folder)
    assert done.returncode == 0, done.stderr[-5000:]
    return folder, done.stderr, time.time() - start


def test_every_rule_is_a_slurm_job_listed_by_sacct_with_its_rule(dag: tuple[Path, str, float]) -> None:
    folder, log, _ = dag
    submitted = re.findall(r"Job \d+ has been submitted with SLURM jobid (\d+) \(log: \S+/slurm_logs/rule_(\w+)/", log)
    rules = Counter(rule for _, rule in submitted)
    assert rules == {
        "mlflow_store": 1, "toy_world": 1, "tiny_model": 1, "toy_stats": 1, "sft": 1, "calibrate": 1,
        "complementarity": 1, "rl": 2, "evaluate": 2, "report": 1,
    }  # fmt: skip
    accounted = {row[0]: row for row in _sacct("-o", "JobIDRaw,Comment,State,Account,Partition")}
    for job, rule in submitted:
        assert job in accounted, f"SLURM job {job} ({rule}) missing from sacct"
        _, comment, state, account, partition = accounted[job]
        assert comment.startswith(f"rule_{rule}"), (job, comment)
        assert (state, account, partition) == ("COMPLETED", "meml", "meml-cpu"), (job, rule)
    # the work ran inside the SLURM jobs, not in a warm worker outside them: each RL job's step
    # imported torch and trained, seconds of CPU (21 s here), where a worker's client takes well
    # under one. (TotalCPU, not MaxRSS: SLURM samples memory every 30 s, so a short step has none.)
    steps = [f"{job}.0" for job, rule in submitted if rule == "rl"]
    for _ in range(30):  # a step's usage reaches the accounting database a little after the job ends
        cpu = {row[0]: row[1] for row in _sacct("-o", "JobIDRaw,TotalCPU", steps=True)}
        if all(cpu.get(step) for step in steps):
            break
        time.sleep(2)
    for step in steps:
        assert _seconds(cpu.get(step, "")) > 5, (step, cpu.get(step))
    for name in ("main", "ablation", "majority_vote", "complementarity", "sparsity"):
        assert (folder / f"report/smoke/tables/{name}.md").is_file(), name


def test_every_cell_is_one_run_on_the_server_with_its_accuracy(dag: tuple[Path, str, float]) -> None:
    folder, log, _ = dag
    experiment = (folder / "grid.yaml").read_text().split("experiment: ")[1].split("}")[0]
    runs = _mlflow_runs(experiment)
    keys = Counter(r.data.tags["cell_key"] for r in runs)
    assert len(keys) == 3 and set(keys.values()) == {1}, keys  # two cells and the report, once each
    for run in runs:
        if run.data.tags.get("method"):
            assert {"eval/expert1/lenient", "reward/mean"} <= set(run.data.metrics), run.data.tags["cell_key"]
            assert run.info.artifact_uri.startswith("mlflow-artifacts:"), run.info.artifact_uri  # served
    import mlflow

    found = mlflow.MlflowClient().get_experiment_by_name(experiment)
    view = json.loads(found.tags["mlflow.sharedViewState.by-method"])
    assert view["selectedColumns"] == ["metrics.`eval/expert1/lenient`", "metrics.`eval/majority_vote/lenient`"]
    assert f"{MLFLOW_URI}/#/experiments/{found.experiment_id}/runs?viewStateShareKey=by-method" in log


def _cell_faults(folder: Path, steps: int) -> Path:
    """A config that gives the MEML-GRPO cell `steps` steps (a new value: the old run moves aside)."""
    path = folder / f"faults-{steps}.yaml"
    path.write_text(f"rl: {{steps: {steps}, checkpoint_every: 1}}\n")
    return path


@pytest.fixture
def background() -> Iterator[list[subprocess.Popen[str]]]:
    """The Snakemake runs a test starts in the background; ended (SIGINT: Snakemake cancels its
    SLURM jobs) if the test fails while they run."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _start_cell(folder: Path, steps: int, background: list[subprocess.Popen[str]]) -> subprocess.Popen[str]:
    """Snakemake on the MEML-GRPO cell's RL job alone, in the background."""
    cmd = _snakemake(folder, str(_cell_faults(folder, steps)), "--", f"{CELL}/DONE")
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())
    background.append(process)
    return process


def _newest_step(checkpoints: Path, since: float) -> int:
    """The highest step checkpointed since `since` (-1: none); old ones vanish as it runs."""
    newest = -1
    for marker in checkpoints.glob("step-*/COMPLETE"):
        try:
            if marker.stat().st_mtime >= since:
                newest = max(newest, int(marker.read_text().split()[0]))
        except (FileNotFoundError, ValueError, IndexError):
            continue
    return newest


def _wait_for_step(folder: Path, step: int, limit: float = 600) -> str:
    """Until the cell's running RL job has checkpointed `step` (a checkpoint written from now on:
    the run before it moves aside when the job starts); its SLURM job id."""
    since, deadline = time.time(), time.time() + limit
    while time.time() < deadline:
        if _newest_step(folder / CELL / "checkpoints", since) >= step:
            # this folder's job: another run of the same grid may be queued beside it
            jobs = subprocess.run(["squeue", "-h", "-t", "R", "-o", "%i|%k|%Z"], capture_output=True, text=True).stdout
            for line in jobs.splitlines():
                job, comment, workdir = line.split("|")
                if comment.strip() == COMMENT and Path(workdir.strip()) == folder:
                    return job
        time.sleep(0.5)
    raise AssertionError(f"the RL job did not reach step {step} in {limit:.0f}s")


def _steps_once(folder: Path, steps: int) -> None:
    """metrics.jsonl and the MLflow run hold every step once (reward/mean: one value a step)."""
    rows = [json.loads(line) for line in (folder / CELL / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(steps))
    import mlflow

    mlflow.set_tracking_uri(MLFLOW_URI)
    run_id = (folder / CELL / "mlflow_run_id").read_text().strip()
    history = [m.step for m in mlflow.MlflowClient().get_metric_history(run_id, "reward/mean")]
    assert sorted(history) == list(range(steps)), history


@faults
def test_the_database_password_is_on_no_command_line(cluster: object) -> None:
    """`ps` shows every user each process's command line: the MLflow server (and its workers) get
    PostgreSQL's password from a password file, never from their arguments."""
    secret = (STATE / "pg.secret").read_text().strip()
    assert len(secret) >= 16
    lines = []
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            lines.append(path.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:  # a process that ended meanwhile
            continue
    assert any("mlflow server" in line for line in lines), "the MLflow server is not running"
    assert not [line for line in lines if secret in line]


def test_scancel_of_a_running_rl_job_fails_it_and_the_rerun_resumes(
    dag: tuple[Path, str, float], background: list[subprocess.Popen[str]]
) -> None:
    folder, _, _ = dag
    steps = 12
    run = _start_cell(folder, steps, background)
    job = _wait_for_step(folder, 3)
    subprocess.run(["scancel", job], check=True)
    out, _ = run.communicate(timeout=600)
    assert run.returncode != 0, out[-3000:]
    assert re.search(rf"SLURM-job '{job}' failed, SLURM status is: 'CANCELLED'", out), out[-3000:]
    assert _sacct("-j", job, "-o", "State")[0][0].startswith("CANCELLED")
    assert not (folder / CELL / "DONE").exists()
    again = _run(folder, str(_cell_faults(folder, steps)), "--", f"{CELL}/DONE")
    assert again.returncode == 0, again.stderr[-4000:]
    log = (folder / "logs/smoke/rl/qwen2/gsm8k/MEML-GRPO/seed0.log").read_text()
    resumed = re.search(r"resuming \S+ at step (\d+) of 12", log)
    assert resumed and int(resumed.group(1)) >= 3, log[-2000:]
    _steps_once(folder, steps)


@faults
def test_the_node_daemon_killed_and_restarted_during_a_job(
    dag: tuple[Path, str, float], background: list[subprocess.Popen[str]]
) -> None:
    folder, _, _ = dag
    steps = 13
    run = _start_cell(folder, steps, background)
    job = _wait_for_step(folder, 2)
    pid = int((STATE / "run/slurmd.pid").read_text())
    os.kill(pid, signal.SIGKILL)  # the node daemon dies; the job's step daemon and the job live on
    time.sleep(5)
    restarted = _cluster("start")
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    out, _ = run.communicate(timeout=900)
    fate = _sacct("-j", job, "-o", "State")[0][0]
    print(f"SLURM job {job} after slurmd was killed and restarted: {fate}; snakemake exit {run.returncode}")
    if run.returncode != 0:  # reported, then a rerun finishes it
        assert re.search(rf"SLURM-job '{job}' failed", out), out[-3000:]
        again = _run(folder, str(_cell_faults(folder, steps)), "--", f"{CELL}/DONE")
        assert again.returncode == 0, again.stderr[-4000:]
    else:
        assert fate == "COMPLETED", fate
    _steps_once(folder, steps)


@faults
def test_the_mlflow_server_down_for_a_minute_during_a_run(
    dag: tuple[Path, str, float], background: list[subprocess.Popen[str]]
) -> None:
    folder, _, _ = dag
    steps, outage = 14, float(os.environ.get("MEML_CLUSTER_OUTAGE_S", "60"))
    run = _start_cell(folder, steps, background)
    _wait_for_step(folder, 1)
    down = time.time()
    stopped = _cluster("stop", "mlflow")
    assert "mlflow stopped" in stopped.stdout, stopped.stdout + stopped.stderr
    time.sleep(max(0.0, outage - (time.time() - down)))
    restarted = _cluster("start")
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    print(f"MLflow server down for {time.time() - down:.0f}s")
    out, _ = run.communicate(timeout=900)
    assert run.returncode == 0, out[-4000:]  # the client retried: the job neither failed nor lost a step
    _steps_once(folder, steps)


@faults
def test_a_gpu_rule_asks_slurm_for_a_gpu(dag: tuple[Path, str, float]) -> None:
    """`device: cuda` gives the GPU rules `gpu=1`, which the plugin submits as `--gpus=1` (the same
    in profiles/slurm). This node has no GPU, so SLURM refuses the request, naming it."""
    folder, _, _ = dag
    cuda = folder / "cuda.yaml"
    cuda.write_text("device: cuda\n")
    run = _run(folder, str(cuda), "--", "results/smoke/sft/qwen2/gsm8k/e0-e1-e2/DONE", timeout=600)
    assert run.returncode != 0
    failed = run.stderr.split("SLURM sbatch failed.")[-1]
    assert "sbatch call:" in failed and "--gpus=1" in failed, run.stderr[-3000:]
