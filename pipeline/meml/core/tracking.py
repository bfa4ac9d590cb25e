"""Step metrics: always a JSONL file in the run folder; also MLflow when enabled.

One MLflow run per cell, tagged `cell_key` (a deterministic key of the values that define the
cell) and found again by it, so a re-run or a resumed run never creates a second MLflow run.
Metric names use only characters MLflow accepts (letters, digits, _ - . / and space).

Exactly once: a step's metrics reach MLflow only when `commit` is called, after the checkpoint that
covers the step is written. A run killed between a step and its checkpoint redoes that step on
resume; MLflow, which cannot delete a value, never saw it. On start the tracker also sends MLflow
the kept steps it lacks (a kill between a checkpoint and its commit), so each (key, step) is
logged once.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meml.core.io import DataError, atomic_write_text

# MLflow's usage telemetry off, before any job imports mlflow: the jobs send nothing anywhere but
# their store, and its client thread's edits of os.environ raced a request's read of it (one of 32
# jobs logging at once failed on `'_MLFLOW_TELEMETRY_SESSION_ID'`: scripts/mlflow_concurrency.py).
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

_BAD_CHARS = re.compile(r"[^A-Za-z0-9_\-./ ]")


@dataclass(frozen=True)
class MLflowSettings:
    """The config's `mlflow` section, read once: every function here takes this, never the dict."""

    tracking_uri: str
    experiment: str  # the experiment's name: mlflow.experiment, else the profile's
    enabled: bool = True  # False: each run writes its metrics.jsonl alone
    artifacts: str | None = None  # the folder the experiment's files go to; None: MLflow's default
    description: str = ""  # the note on the experiment's page in the UI

    @classmethod
    def of(cls, cfg: dict[str, Any]) -> MLflowSettings:
        """One experiment per profile, named after it unless `mlflow.experiment` says otherwise, and
        described on its page in the UI."""
        section = cfg["mlflow"]
        world = "toy world (synthetic data sets, tiny models, CPU)" if cfg["world"] == "toy" else "real data sets"
        description = (
            f"MEML-GRPO reproduction, profile '{cfg['profile']}': {world}. One run per cell "
            "(model x data set x method x seed); group by the tags model, dataset, method, advantage, iml, hsft. "
            f"Tables and figures: report/{cfg['profile']}/index.md, and the '{cfg['profile']}/report' run's artifacts."
        )
        return cls(
            str(section["tracking_uri"]),
            str(section["experiment"] or cfg["profile"]),
            bool(section["enabled"]),
            section["artifacts"],
            description,
        )


@dataclass(frozen=True)
class RunTracking:
    """Where a training run reports besides its metrics.jsonl: the MLflow run its `key` finds."""

    key: str  # the cell key: one MLflow run per key, found again on a rerun or a resume
    params: dict[str, Any]  # the MLflow run's params
    tags: dict[str, str] = field(default_factory=dict)  # the grid's dimensions and the method's switches
    mlflow: MLflowSettings | None = None  # None (or not enabled): metrics.jsonl only


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl. A torn last line (a kill mid-write) is dropped: its step had
    no checkpoint yet and is redone. A bad line anywhere else names the file and line."""
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines):
                break
            raise DataError(f"not valid JSON ({err.msg}): a damaged metrics file", path, number) from None
        if not isinstance(row, dict) or "step" not in row:
            raise DataError("a metrics row without 'step'", path, number)
        rows.append(row)
    return rows


def metric_name(name: str) -> str:
    return _BAD_CHARS.sub("_", name)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            out.update(flatten(value, name))
        else:
            out[name] = value
    return out


def ensure_experiment(settings: MLflowSettings) -> str:
    """Point MLflow at the store and return the experiment's id, creating it (with its artifacts in
    `settings.artifacts`, made absolute) the first time. The DAG calls this once, from one
    process, before parallel jobs start: processes creating a new SQLite store at once corrupt it."""
    import mlflow

    uri = settings.tracking_uri
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    name = settings.experiment
    experiment = mlflow.get_experiment_by_name(name)
    if experiment is None:
        location = (Path(settings.artifacts).resolve() / name).as_uri() if settings.artifacts else None
        experiment_id = str(mlflow.create_experiment(name, artifact_location=location))
    else:
        experiment_id = str(experiment.experiment_id)
    client = mlflow.MlflowClient()
    if settings.description:  # the UI shows this note on the experiment's page
        client.set_experiment_tag(experiment_id, "mlflow.note.content", settings.description)
    # Open on the training runs (MLflow 3's UI otherwise opens a GenAI overview), and a saved view
    # of the runs table grouped by the method tag: the link the end-of-run message prints
    client.set_experiment_tag(experiment_id, "mlflow.experimentKind", "custom_model_development")
    # written when missing only: the report job rewrites it with the headline columns
    # (set_grouped_view), which a later job must not take away
    if SHARED_VIEW_PREFIX + GROUPED_VIEW not in client.get_experiment(experiment_id).tags:
        set_grouped_view(client, experiment_id)
    return experiment_id


SHARED_VIEW_PREFIX = "mlflow.sharedViewState."  # how the MLflow UI (3.x) stores a shared view
GROUPED_VIEW = "by-method"
GROUPED_STATE = {"groupBy": {"aggregateFunction": "average", "groupByKeys": [{"mode": "tag", "groupByData": "method"}]}}


def headline_metrics(cfg: dict[str, Any]) -> list[str]:
    """The metrics the tables report for a cell: the headline expert's accuracy and the majority
    vote's, in the report's checker mode (as `log_evaluation` names them)."""
    mode = cfg["reward"]["mode"]
    return [f"eval/expert{cfg['report']['headline_expert']}/{mode}", f"eval/majority_vote/{mode}"]


def grouped_state(columns: Sequence[str] = ()) -> dict[str, Any]:
    """The grouped view's state; `columns` (metric names) become the runs table's columns, each
    group showing its runs' mean. The UI names a column `metrics.`<name>``."""
    state: dict[str, Any] = dict(GROUPED_STATE)
    if columns:
        state["selectedColumns"] = [f"metrics.`{metric_name(c)}`" for c in columns]
    return state


def set_grouped_view(client: Any, experiment_id: str, columns: Sequence[str] = ()) -> None:
    client.set_experiment_tag(experiment_id, SHARED_VIEW_PREFIX + GROUPED_VIEW, json.dumps(grouped_state(columns)))


def grouped_view_url(experiment_id: str, host: str = "http://127.0.0.1:5000") -> str:
    """The UI's runs table of an experiment, grouped by method (mean of each group's metrics)."""
    return f"{host}/#/experiments/{experiment_id}/runs?viewStateShareKey={GROUPED_VIEW}"


def run_name(cell_key: str) -> str:
    """A run's name in the UI, its cell in the first characters (the runs table cuts long names):
    `MEML-GRPO qwen2 gsm8k seed0` for the cell key `toy/qwen2/gsm8k/MEML-GRPO/seed0#<hash>`."""
    path = cell_key.split("#")[0]
    parts = path.split("/")
    if len(parts) == 5:  # profile/model/dataset/method/seed
        _, model, dataset, method, seed = parts
        return f"{method} {model} {dataset} {seed}"
    return path


def retire_run(settings: MLflowSettings, run_id: str, label: str) -> None:
    """A replaced run leaves the experiment's views: its `cell_key` is retagged
    (`<key>@replaced-<label>`) and it is marked deleted, MLflow's own lifecycle, so no grouped view
    or mean counts it while it stays restorable (`mlflow runs restore --run-id ID`, or the UI's
    deleted runs). The cell's next run is a new MLflow run, which names it in its `replaces` tag."""
    import mlflow

    mlflow.set_tracking_uri(settings.tracking_uri)
    client = mlflow.MlflowClient()
    try:
        run = client.get_run(run_id)
    except Exception:  # the store no longer holds it: nothing to retag
        return
    key = run.data.tags.get("cell_key", "")
    if "@replaced-" not in key:
        client.set_tag(run_id, "cell_key", f"{key}@replaced-{label}")
    if run.info.lifecycle_stage != "deleted":
        client.delete_run(run_id)


def replaced_runs(experiment_id: str, cell_key: str) -> list[str]:
    """The ids of the runs this cell's runs replaced (deleted, retagged `<key>@replaced-...`)."""
    import mlflow
    from mlflow.entities import ViewType

    found = mlflow.search_runs(
        [experiment_id],
        filter_string=f"tags.cell_key LIKE '{cell_key}@replaced-%'",
        run_view_type=ViewType.DELETED_ONLY,
        output_format="list",
    )
    return sorted(r.info.run_id for r in found)


def log_to_run(
    settings: MLflowSettings,
    run_id: str,
    metrics: dict[str, float],
    artifacts: list[str | Path] = (),  # type: ignore[assignment]
) -> None:
    """Add metrics and files to an existing run (evaluation results to their cell's RL run)."""
    import mlflow

    mlflow.set_tracking_uri(settings.tracking_uri)
    client = mlflow.MlflowClient()
    for name, value in metrics.items():
        client.log_metric(run_id, metric_name(name), float(value))
    for path in artifacts:
        client.log_artifact(run_id, str(path))


def run_tags(cfg: dict[str, Any], cell: Any) -> dict[str, str]:
    """The tags a cell's run carries (cell: model, dataset, method, seed), so that the UI's "Group
    by" and search work on the grid's dimensions and the method's switches without knowing the
    cell-key format."""
    switches = cfg["methods"][cell.method]
    return {
        "profile": cfg["profile"],
        "world": cfg["world"],
        "model": cell.model,
        "dataset": cell.dataset,
        "method": cell.method,
        "seed": str(cell.seed),
        "advantage": switches["advantage"],
        "iml": str(bool(switches["iml"])).lower(),
        "hsft": str(bool(switches["hsft"])).lower(),
        "experts_in_rl": ",".join(str(k) for k in switches["rl_experts"]),
        "sft_experts": ",".join(str(k) for k in switches["sft_experts"]),
    }


def cell_run(settings: MLflowSettings, run_folder: str | Path) -> str | None:
    """The MLflow run an RL run folder names (`mlflow_run_id`), where the configured store holds it;
    else None, with a line saying why: the cell trained with mlflow.enabled off, or it was logged to
    another store (the mlflow keys are run keys, core/config.RUN_KEYS: a finished cell is not rerun
    when they change, and a new store does not hold its run)."""
    import mlflow
    from mlflow.exceptions import MlflowException

    path = Path(run_folder) / "mlflow_run_id"
    if not path.is_file():
        print(f"[meml] no MLflow run beside {run_folder} (trained with mlflow.enabled off?): "
              "the evaluation is in its file alone", file=sys.stderr)  # fmt: skip
        return None
    run_id = path.read_text().strip()
    mlflow.set_tracking_uri(settings.tracking_uri)
    try:
        mlflow.MlflowClient().get_run(run_id)
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        print(f"[meml] the cell's MLflow run {run_id} is not in {settings.tracking_uri} (it was logged to the store "
              "mlflow.tracking_uri named then): the evaluation is in its file alone", file=sys.stderr)  # fmt: skip
        return None
    return run_id


def log_evaluation(settings: MLflowSettings, run_id: str, block: dict[str, Any], files: list[str | Path]) -> None:
    """An evaluation's accuracies on its cell's RL run, in % as the tables give them, named like the
    training metrics (reward/expert1 in training, eval/expert1/lenient here), and its JSON as an artifact."""
    metrics = {  # in %, as every table shows them
        f"eval/expert{name[1:]}/{m}": round(100 * e[m], 2)
        for name, e in block["experts"].items()
        for m in ("strict", "lenient", "finished")
    }
    for mode in ("strict", "lenient") if "majority_vote" in block else ():
        metrics[f"eval/majority_vote/{mode}"] = round(100 * block["majority_vote"][mode], 2)
    log_to_run(settings, run_id, metrics, files)


def log_teacher(
    cfg: dict[str, Any], folder: Path, dataset: str, expert: int, teacher: dict[str, Any], summary: dict[str, Any]
) -> None:
    """One run per data set and teacher with its acceptance counts; the key's NAME may appear, the
    key never does."""
    substitute = teacher["backend"] == "vllm"
    tracker = Tracker(
        folder,
        f"{cfg['profile']}/teacher/{dataset}/e{expert}",
        {"teacher": teacher, "dataset": dataset, "expert": expert},
        MLflowSettings.of(cfg),
        tags={
            "teacher_backend": teacher["backend"],
            "teacher_model": str(teacher.get("model") or ""),
            **({"deviation": "substitute teacher model (local vLLM), not the paper's"} if substitute else {}),
        },
    )
    tracker.log(0, {k: float(v) for k, v in summary.items() if isinstance(v, (int, float)) and v is not None})
    tracker.close()


def log_report(cfg: dict[str, Any], folder: Path, written: list[Path]) -> None:
    """The tables and figures as artifacts of one run per profile, found again by its key."""
    tracker = Tracker(
        folder, f"{cfg['profile']}/report", {"grid": cfg["grid"], "report": cfg["report"]}, MLflowSettings.of(cfg)
    )
    for path in written:
        tracker.log_artifact(path)
    experiment_id = tracker.experiment_id
    tracker.close()
    if experiment_id is not None:  # the end message's link: runs grouped by method, accuracy as columns
        import mlflow

        set_grouped_view(mlflow.MlflowClient(), experiment_id, headline_metrics(cfg))


class Tracker:
    def __init__(
        self,
        run_dir: str | Path,
        cell_key: str,
        params: dict[str, Any],
        mlflow: MLflowSettings | None = None,
        resume_from_step: int = 0,
        tags: dict[str, str] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        self._keep_steps_before(resume_from_step)
        self._file = self.path.open("a", encoding="utf-8")
        self._pending: list[tuple[int, dict[str, float]]] = []
        self._mlflow: Any = None
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        if mlflow is not None and mlflow.enabled:
            self._start_mlflow(cell_key, params, mlflow, tags or {})

    def _keep_steps_before(self, step: int) -> None:
        """On resume, drop the lines of steps after the checkpoint: they are about to be redone."""
        atomic_write_text(
            self.path, "".join(json.dumps(row) + "\n" for row in read_metrics(self.path) if row["step"] < step)
        )

    def _start_mlflow(
        self, cell_key: str, params: dict[str, Any], settings: MLflowSettings, tags: dict[str, str]
    ) -> None:
        import mlflow

        experiment_id = self.experiment_id = ensure_experiment(settings)
        flat = {metric_name(k): str(v)[:500] for k, v in flatten(params).items()}
        found = mlflow.search_runs(
            [experiment_id],
            filter_string=f"tags.cell_key = '{cell_key}'",
            output_format="list",
            max_results=1,
        )
        record = self.run_dir / "mlflow_run_id"
        mine = record.read_text().strip() if record.is_file() else None
        run_id = None
        for old in found:
            changed = any(old.data.params.get(k, v) != v for k, v in flat.items())
            if old.info.run_id == mine and not changed:
                run_id = old.info.run_id  # this folder's own run, resumed
            else:  # a run this folder never wrote (results deleted) or of other values: keep it, aside
                retire_run(settings, old.info.run_id, time.strftime("%Y%m%d-%H%M%S"))
        if run_id is not None:
            run = mlflow.start_run(run_id=run_id)
        else:
            run = mlflow.start_run(
                experiment_id=experiment_id, run_name=run_name(cell_key), tags={"cell_key": cell_key}
            )
        if tags:
            mlflow.set_tags(tags)
        replaced = replaced_runs(experiment_id, cell_key)
        if replaced:  # the runs of this cell it replaced: deleted, restorable, and named here
            mlflow.set_tag("replaces", ",".join(replaced))
        # logged on every start (same key, same value is allowed), so a run that died before its
        # params were written gets them on the re-run
        for start in range(0, len(flat), 100):
            mlflow.log_params(dict(list(flat.items())[start : start + 100]))
        atomic_write_text(self.run_dir / "mlflow_run_id", run.info.run_id + "\n")
        self.run_id = run.info.run_id
        self._mlflow = mlflow
        rows = read_metrics(self.path)
        if rows:  # the kept steps MLflow lacks (killed after a checkpoint, before its commit)
            client = mlflow.MlflowClient()
            logged = {m.step for m in client.get_metric_history(run.info.run_id, "reward/mean")}
            for row in rows:
                if row["step"] not in logged and "reward/mean" in row:
                    mlflow.log_metrics({k: v for k, v in row.items() if k != "step"}, step=int(row["step"]))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        clean = {metric_name(k): float(v) for k, v in metrics.items()}
        self._file.write(json.dumps({"step": step, **clean}) + "\n")
        self._file.flush()
        self._pending.append((step, clean))

    def commit(self) -> None:
        """Send the steps logged since the last commit to MLflow: call it once their checkpoint exists."""
        if self._mlflow is not None:
            for step, clean in self._pending:
                self._mlflow.log_metrics(clean, step=step)
        self._pending = []

    def log_artifact(self, path: str | Path) -> None:
        if self._mlflow is not None:
            self._mlflow.log_artifact(str(path))

    def close(self, status: str = "FINISHED") -> None:
        if status == "FINISHED":
            self.commit()
        self._file.close()
        if self._mlflow is not None:
            self._mlflow.end_run(status=status)
            self._mlflow = None
