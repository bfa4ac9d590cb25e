from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from meml.core.tracking import MLflowSettings, Tracker, flatten, metric_name


def test_a_runs_name_starts_with_its_cell() -> None:
    from meml.core.tracking import run_name

    assert run_name("toy/qwen2/gsm8k/MEML-GRPO/seed0#0123abcd") == "MEML-GRPO qwen2 gsm8k seed0"
    assert run_name("toy/report") == "toy/report"


def test_metric_names_and_flatten() -> None:
    assert metric_name("subgroups/all_wrong/expert1") == "subgroups/all_wrong/expert1"
    assert metric_name("reward (mean)%") == "reward _mean__"
    assert flatten({"rl": {"buffer": {"capacity": 64}}, "seed": 0}) == {"rl.buffer.capacity": 64, "seed": 0}


def test_jsonl_is_truncated_to_the_resumed_step(tmp_path: Path) -> None:
    t = Tracker(tmp_path, "cell", {})
    for step in range(5):
        t.log(step, {"reward/mean": step / 10})
    t.close()
    resumed = Tracker(tmp_path, "cell", {}, resume_from_step=3)
    resumed.log(3, {"reward/mean": 0.9})
    resumed.close()
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3]


def test_mlflow_run_is_found_again_by_its_cell_key(tmp_path: Path) -> None:
    import mlflow

    settings = MLflowSettings(f"sqlite:///{tmp_path / 'mlflow.db'}", "test")
    for attempt in range(2):  # a re-run of the same cell
        t = Tracker(tmp_path / "run", "toy/qwen2/gsm8k/MEML-GRPO/seed0", {"rl": {"lr": 1e-4}}, settings)
        t.log(attempt, {"reward/mean": 0.5})
        t.close()
    mlflow.set_tracking_uri(settings.tracking_uri)
    runs = mlflow.search_runs(experiment_names=["test"], output_format="list")
    assert len(runs) == 1
    assert runs[0].data.params["rl.lr"] == "0.0001"
    history = mlflow.MlflowClient().get_metric_history(runs[0].info.run_id, "reward/mean")
    assert sorted(m.step for m in history) == [0, 1]
    assert (tmp_path / "run/mlflow_run_id").read_text().strip() == runs[0].info.run_id


@pytest.fixture(params=["sqlite", "server"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An MLflow store: the SQLite file, or a tracking server on 127.0.0.1 in front of one."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'mlflow.db'}"
        return
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
           "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
           "--artifacts-destination", str(tmp_path / "artifacts")]  # fmt: skip
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("the MLflow server did not answer within 2 minutes")
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_a_run_this_folder_never_wrote_or_of_other_values_is_kept_aside(tmp_path: Path, store: str) -> None:
    """The results folder deleted, or the run's values changed: the old MLflow run is retagged
    (`<key>@replaced-<time>`) and marked deleted (restorable), a new one starts and names the runs
    it replaced; logging never fails on a changed param. Only the current run is active, so no
    grouped view or mean counts a replaced one."""
    import mlflow
    from mlflow.entities import ViewType

    settings = MLflowSettings(store, "test")
    key = "toy/report"
    Tracker(tmp_path / "a", key, {"report": {"margin": 2.0}}, settings).close()
    Tracker(tmp_path / "b", key, {"report": {"margin": 2.0}}, settings).close()  # a fresh folder
    Tracker(tmp_path / "b", key, {"report": {"margin": 1.0}}, settings).close()  # changed values
    Tracker(tmp_path / "b", key, {"report": {"margin": 1.0}}, settings).close()  # the same again: resumed
    mlflow.set_tracking_uri(settings.tracking_uri)
    active = mlflow.search_runs(experiment_names=["test"], output_format="list")
    assert [r.data.tags["cell_key"] for r in active] == [key]  # one active run per cell
    current = active[0]
    runs = mlflow.search_runs(experiment_names=["test"], output_format="list", run_view_type=ViewType.ALL)
    retired = [r for r in runs if r.data.tags["cell_key"].startswith(f"{key}@replaced-")]
    assert len(runs) == 3 and len(retired) == 2
    assert all(r.info.lifecycle_stage == "deleted" for r in retired)
    assert current.data.params["report.margin"] == "1.0"
    assert current.data.tags["replaces"] == ",".join(sorted(r.info.run_id for r in retired))
    assert (tmp_path / "b/mlflow_run_id").read_text().strip() == current.info.run_id
    client = mlflow.MlflowClient()
    client.restore_run(retired[0].info.run_id)  # restorable, with its metrics and params
    assert client.get_run(retired[0].info.run_id).info.lifecycle_stage == "active"


def test_the_report_puts_the_headline_accuracy_into_the_grouped_view(tmp_path: Path) -> None:
    """The end message's view: grouped by method, the report's headline expert and majority vote in
    the report's checker mode as columns; a later job's ensure_experiment keeps them."""
    import mlflow

    from meml.core.tracking import ensure_experiment, log_report

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow_cfg = {"enabled": True, "tracking_uri": uri, "experiment": None, "artifacts": None}
    cfg = {
        "profile": "toy", "world": "toy", "mlflow": mlflow_cfg, "grid": {}, "report": {"headline_expert": 2},
        "reward": {"mode": "strict"},
    }  # fmt: skip
    settings = MLflowSettings(uri, "toy")
    experiment_id = ensure_experiment(settings)
    view = "mlflow.sharedViewState.by-method"
    before = json.loads(mlflow.MlflowClient().get_experiment(experiment_id).tags[view])
    assert "selectedColumns" not in before and before["groupBy"]["groupByKeys"][0]["groupByData"] == "method"
    log_report(cfg, tmp_path / "report-run", [])
    ensure_experiment(settings)  # a job started after the report (a rerun) leaves the view as it is
    after = json.loads(mlflow.MlflowClient().get_experiment(experiment_id).tags[view])
    assert after["selectedColumns"] == ["metrics.`eval/expert2/strict`", "metrics.`eval/majority_vote/strict`"]
    assert after["groupBy"] == before["groupBy"]


def test_the_end_message_names_a_tracking_server_and_links_its_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from meml.reporting.finish import message

    monkeypatch.chdir(tmp_path)
    (tmp_path / "results/smoke").mkdir(parents=True)
    marker = tmp_path / "results/smoke/mlflow_experiment.json"
    made = {"tracking_uri": "http://mlflow.example:5000/", "experiment": "smoke", "experiment_id": "7"}
    marker.write_text(json.dumps(made))
    server = {"enabled": True, "tracking_uri": "http://mlflow.example:5000/", "experiment": None, "artifacts": None}
    cfg = {"profile": "smoke", "world": "toy", "mlflow": server}
    text = message(cfg)
    assert "the tracking server http://mlflow.example:5000/ (experiment 'smoke')" in text
    assert "open http://mlflow.example:5000/#/experiments/7/runs?viewStateShareKey=by-method" in text
    assert "--backend-store-uri" not in text
    # the marker names the store the grid started in; a server named since holds another id: no link
    marker.write_text(json.dumps({**made, "tracking_uri": "sqlite:///results/mlflow.db"}))
    assert "#/experiments/7" not in message(cfg) and "the tracking server http://mlflow.example:5000/" in message(cfg)


def test_mlflow_pointed_elsewhere_is_made_ready_at_the_start_and_an_evaluation_logs_only_where_its_run_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mlflow keys are run keys: a finished grid pointed at another store reruns nothing. The
    workflow's start then makes the new store and experiment (before jobs start at once), and says
    where the finished jobs logged; an evaluation whose cell's run lives in the old store writes its
    file alone and says so, where the store holds the run it logs to it."""
    import mlflow

    from meml.core.tracking import cell_run, ensure_experiment
    from meml.lifecycle import mlflow_store
    from meml.plan.layout import Layout

    monkeypatch.chdir(tmp_path)
    old, new = f"sqlite:///{tmp_path / 'old.db'}", f"sqlite:///{tmp_path / 'new.db'}"
    cfg = {"profile": "p", "world": "toy",
           "mlflow": {"enabled": True, "tracking_uri": old, "experiment": None, "artifacts": None}}  # fmt: skip
    marker = Layout.of(cfg).mlflow_marker
    marker.parent.mkdir(parents=True)
    made = {"tracking_uri": old, "experiment": "p", "experiment_id": ensure_experiment(MLflowSettings(old, "p"))}
    marker.write_text(json.dumps(made))
    assert mlflow_store(cfg) is None  # the store the marker names: nothing to do
    cell = tmp_path / "cell"
    tracker = Tracker(cell, "p/cell", {"x": 1}, MLflowSettings(old, "p"))
    tracker.close()
    assert cell_run(MLflowSettings(old, "p"), cell) == tracker.run_id
    moved = {**cfg, "mlflow": {**cfg["mlflow"], "tracking_uri": new}}
    experiment_id = mlflow_store(moved)
    assert experiment_id is not None and "the finished jobs logged to " + old in capsys.readouterr().err
    mlflow.set_tracking_uri(new)
    assert mlflow.get_experiment_by_name("p").experiment_id == experiment_id
    assert json.loads(marker.read_text()) == made  # the marker is an input of every job that logs: untouched
    assert cell_run(MLflowSettings(new, "p"), cell) is None
    assert f"is not in {new}" in capsys.readouterr().err
