"""The warm worker runs a job as the fresh process would: same files, same exit code, its own
folder and environment; without a worker the job runs in place."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PROJECT

from meml import worker

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the worker forks: Linux only")


def _job(tmp: Path, sock: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(PROJECT / "pipeline"), "MEML_MARK": "from-the-job"}
    env.pop("MEML_WORKER", None)
    if sock is not None:
        env["MEML_WORKER"] = str(sock)
    return subprocess.run([sys.executable, "-m", "meml.run", *args], cwd=tmp, env=env, capture_output=True, text=True)


def test_a_job_in_the_worker_equals_a_fresh_one(tmp_path: Path) -> None:
    sock = tmp_path / "w.sock"
    process = worker.start(sock, {"PYTHONPATH": str(PROJECT / "pipeline")})
    assert process is not None, (tmp_path / "w.log").read_text()
    try:
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        warm = _job(tmp_path / "a", sock, "toy-world", "--out", "toy", "--set", "toy.sizes.gsm8k=[20,5]")
        fresh = _job(tmp_path / "b", None, "toy-world", "--out", "toy", "--set", "toy.sizes.gsm8k=[20,5]")
        assert warm.returncode == fresh.returncode == 0, warm.stderr + fresh.stderr
        assert warm.stdout == fresh.stdout  # the job's stdout reached the caller
        files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.jsonl"))
        assert files and all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files)
        bad = _job(tmp_path, sock, "rl", "--dataset", "svamp")
        assert bad.returncode == 2 and "error" in bad.stderr  # the exit code and stderr come back
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert not sock.exists()
    gone = _job(tmp_path, sock, "toy-world", "--out", "c")  # no worker: the job runs in place
    assert gone.returncode == 0 and (tmp_path / "c/data/gsm8k/train.jsonl").is_file()


def test_progress_line_counts_jobs_and_estimates_time_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json
    import time

    from meml.progress import finished_jobs, line, time_left

    monkeypatch.chdir(tmp_path)
    now = time.time()
    start = now - 80
    rules = {"tiny_model": 2, "rl": 4, "evaluate": 4}
    (tmp_path / "state.json").write_text(json.dumps({"start": start, "total": 10, "rules": rules}))
    metadata = tmp_path / ".snakemake/metadata"
    metadata.mkdir(parents=True)
    records = [  # (job, rule, start, end): job 1 is an older run's; job 3 wrote two outputs
        (1, "rl", start - 50, start - 5),
        (2, "tiny_model", start, start + 30),
        (3, "tiny_model", start + 30, start + 60),
        (3, "tiny_model", start + 30, start + 60),
        (4, "rl", start + 60, start + 70),
        (5, "rl", start + 70, start + 80),
    ]
    for i, (job, rule, begin, end) in enumerate(records):
        (metadata / f"out{i}").write_text(
            json.dumps({"job_hash": job, "rule": rule, "starttime": begin, "endtime": end})
        )
    cell = tmp_path / "results/t/eval/qwen2/gsm8k/MEML-GRPO/seed0.json"
    cell.parent.mkdir(parents=True)
    cell.write_text(json.dumps({"model": {"experts": {"e1": {"lenient": 0.125}}}}))
    # by hand: 80 job-seconds in 80 s (concurrency 1); left: 2 rl jobs at their 10 s, and 4
    # evaluations at the mean of all finished jobs (80 / 4 = 20 s): 100 s, about 2 min
    state = json.loads((tmp_path / "state.json").read_text())
    assert time_left(state, finished_jobs(metadata, start), now) == pytest.approx(100.0)
    text = line(cell, tmp_path / "state.json", now=now)
    assert text.startswith("[meml] 5/10 jobs, about 2 min left")
    assert "qwen2/gsm8k/MEML-GRPO/seed0: expert 1 12.5%" in text


def test_a_job_stopped_by_sigterm_fails(tmp_path: Path) -> None:
    """SIGTERM to a job in the worker stops the forked child running it, and the job fails.
    The job waits on its config file, a FIFO, so the test knows when the child is inside the job
    (its open for reading is what lets ours for writing succeed) instead of guessing a time."""
    import errno
    import signal
    import time

    sock = tmp_path / "w.sock"
    process = worker.start(sock, {"PYTHONPATH": str(PROJECT / "pipeline")})
    assert process is not None
    config = tmp_path / "config.yaml"
    os.mkfifo(config)
    writer = -1
    try:
        env = {**os.environ, "PYTHONPATH": str(PROJECT / "pipeline"), "MEML_WORKER": str(sock)}
        job = subprocess.Popen(
            [sys.executable, "-m", "meml.run", "toy-world", "--out", "x", "--config", str(config)],
            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while writer < 0:  # opening a FIFO's write end without blocking fails until a reader has it
            try:
                writer = os.open(config, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as error:
                assert error.errno == errno.ENXIO, error
                assert job.poll() is None, "the job ended before it read its config"
                assert time.monotonic() < deadline, "the job never opened its config"
                time.sleep(0.05)
        job.send_signal(signal.SIGTERM)  # what Snakemake sends a job it cancels; passed to the child
        assert job.wait(timeout=60) != 0
        with pytest.raises(BrokenPipeError):  # no reader left: the child that held the FIFO is gone
            os.write(writer, b"profile: x\n")
    finally:
        if writer >= 0:
            os.close(writer)
        process.terminate()
        process.wait(timeout=30)


def test_the_time_left_against_a_finished_run() -> None:
    """The estimate a progress line prints, replayed over a finished toy-study run's job records
    (rule, start, end in seconds from the run's start; tests/fixtures/study_run_jobs.json) at every
    evaluation: in the run's second half it is closer to the time that was really left than the
    job-count estimate it replaced, and near the end, where the short jobs remain, much closer."""
    import json
    from collections import Counter

    from meml.progress import time_left

    run = json.loads((PROJECT / "tests/fixtures/study_run_jobs.json").read_text())
    rows, wall = run["jobs"], run["wall"]
    state = {"start": 0.0, "total": len(rows), "rules": dict(Counter(rule for rule, _, _ in rows))}
    ours, counted, late = [], [], []
    for i, (rule, _, end) in enumerate(rows):
        if rule != "evaluate" or i + 1 <= len(rows) / 2:
            continue
        finished = {str(j): (r, e - s) for j, (r, s, e) in enumerate(rows[: i + 1])}
        left = wall - end
        estimate = time_left(state, finished, end)
        ours.append(abs(estimate - left))
        counted.append(abs(end / (i + 1) * (len(rows) - i - 1) - left))
        if len(rows) - i - 1 <= 20:  # the last evaluations, with only short jobs after them
            late.append((estimate - left) / 60)
    assert sum(ours) < sum(counted), (sum(ours) / len(ours), sum(counted) / len(counted))
    assert late and max(abs(x) for x in late) < 2.0, late  # within two minutes near the end


def test_jobs_import_the_code_of_the_workflow_that_starts_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second clone sharing the venv: its jobs must run its own meml, not the one the venv was
    installed from (which the job would import without lifecycle.use_workflow_code)."""
    from meml import lifecycle

    clone = tmp_path / "clone" / "pipeline"
    (clone / "meml").mkdir(parents=True)
    (clone / "meml" / "__init__.py").write_text("WHERE = 'the clone'\n")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    probe = [sys.executable, "-c", "import meml; print(getattr(meml, 'WHERE', meml.__file__))"]
    before = subprocess.run(probe, cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()
    assert before != "the clone"  # the installed project, as a job of a second clone got it before
    lifecycle.use_workflow_code(clone)
    lifecycle.use_workflow_code(clone)  # idempotent: Snakemake parses the rules more than once
    assert os.environ["PYTHONPATH"].split(os.pathsep) == [str(clone.resolve()), "/elsewhere"]
    after = subprocess.run(probe, cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()
    assert after == "the clone"
    # the rules call it before any job is defined
    assert (
        'lifecycle.use_workflow_code(Path(workflow.basedir) / "pipeline")'
        in (PROJECT / "pipeline" / "rules" / "common.smk").read_text()
    )
