"""What `meml eval`, `meml calibrate` and `meml complementarity` run: a config and a model folder
in; the stage's function called with the config's settings for that data set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from meml.core import tracking
from meml.core.config import dataset_rl
from meml.core.precision import of_config
from meml.core.records import check_dataset_name
from meml.data.experts import prompts_of
from meml.plan.grid import eval_max_new_tokens
from meml.plan.layout import Layout
from meml.training.rl import sampling_of
from meml.training.rollout_vllm import VLLMSettings


def _data_root(cfg: dict[str, Any], data_root: str | None) -> Path:
    return Path(data_root) if data_root else Layout.of(cfg).data_root(cfg["world"])


def evaluate(
    cfg: dict[str, Any],
    checkpoint: str,
    dataset: str,
    experts: list[int],
    out: str,
    *,
    data_root: str | None = None,
    log_to_run: str | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """Accuracy of each expert prompt and the majority vote; with `log_to_run` (an RL run folder)
    also on that cell's MLflow run, where mlflow.enabled and the configured store holds that run.
    `overrides`: base_model, backend, batch_size, limit, max_new_tokens, real (None keeps the config's)."""
    from meml.evaluation.evaluate import evaluate as run

    check_dataset_name(dataset, "--dataset")
    given = {k: v for k, v in overrides.items() if v}
    settings = tracking.MLflowSettings.of(cfg)
    run_id = tracking.cell_run(settings, log_to_run) if log_to_run and settings.enabled else None
    report = run(
        checkpoint,
        dataset,
        experts,
        _data_root(cfg, data_root),
        out,
        base_model=given.get("base_model"),
        prompts=prompts_of(cfg),
        backend=given.get("backend", cfg["eval"]["backend"]),
        batch_size=given.get("batch_size", cfg["eval"]["batch_size"]),
        device="cpu" if cfg["device"] == "cpu" else "cuda",
        dtype=of_config(cfg).dtype,
        limit=given.get("limit", cfg["eval"]["questions"]),
        world="real" if given.get("real") or cfg["world"] == "real" else "toy",
        max_new_tokens=given.get("max_new_tokens", eval_max_new_tokens(cfg, dataset)),
        vllm=VLLMSettings.from_config(cfg["rl"]["vllm"]),
        mlflow_run_id=run_id,
    )
    if run_id is not None:
        tracking.log_evaluation(settings, run_id, report["model"], [out])
    return report


def calibrate(
    cfg: dict[str, Any], checkpoint: str, dataset: str, experts: list[int], out: str, where: str, data_root: str | None
) -> dict[str, Any]:
    """The gate on one SFT model, sampling as RL will on this data set."""
    from meml.evaluation.calibration import calibrate as run
    from meml.evaluation.calibration import ranges_for

    check_dataset_name(dataset, "--dataset")
    settings = cfg["calibration"]
    headline = cfg["report"]["headline_expert"]
    # the gate guards the MEF (multi-expert) models RL is about; a single-expert baseline's model is
    # measured and reported, never a reason to stop
    gate = settings["gate"] if len(experts) > 1 else "warn"
    ranges, own = ranges_for(settings, dataset)
    return run(
        out,
        gate,
        ranges,
        where,
        own,
        model_dir=checkpoint,
        data_root=_data_root(cfg, data_root),
        dataset=dataset,
        experts=experts,
        headline=headline if headline in experts else experts[0],
        sampling=sampling_of(cfg, dataset),
        train_questions=settings["train_questions"],
        samples=settings["samples"],
        test_questions=settings["test_questions"],
        heldout_samples=dataset_rl(cfg, dataset)["group_size"],
        prompts=prompts_of(cfg),
        mode=cfg["reward"]["mode"],
        seed=cfg["seed"],
        precision=of_config(cfg),
        engine_name=cfg["rl"]["engine"],  # on the job's device (engines.sampling_job_engine)
        vllm=VLLMSettings.from_config(cfg["rl"]["vllm"]),
    )


def complementarity(
    cfg: dict[str, Any],
    checkpoints: list[str],
    dataset: str,
    experts: list[int],
    out: str,
    *,
    data_root: str | None = None,
    split: str | None = None,
    k: int | None = None,
    limit: int | None = None,
    title: str | None = None,
) -> dict[str, Any]:
    """Error overlap of k samples per expert: one MEF model, or one single-expert model per expert."""
    from meml.evaluation.complementarity import run

    check_dataset_name(dataset, "--dataset")
    settings = cfg["analysis"]["complementarity"]
    sampling = sampling_of(cfg, dataset)
    k = k or settings["samples"]
    return run(
        checkpoints[0] if len(checkpoints) == 1 else checkpoints,
        _data_root(cfg, data_root) / dataset / f"{split or settings['split']}.jsonl",
        experts,
        k,
        sampling,
        out,
        title or f"{dataset}: {k} samples per expert, temperature {sampling.temperature}",
        prompts=prompts_of(cfg),
        limit=limit or settings["questions"],
        seed=cfg["seed"],
        mode=cfg["reward"]["mode"],  # the mode every table scores in
        precision=of_config(cfg),
        engine_name=cfg["rl"]["engine"],  # on the job's device (engines.sampling_job_engine)
        vllm=VLLMSettings.from_config(cfg["rl"]["vllm"]),
    )
