"""What `meml sft` and `meml rl` run: a config and a cell's names in; the stage's function called
with everything it needs from the config, the layout and the method's switches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from meml.core import tracking
from meml.core.answers import RewardConfig
from meml.core.config import deep_merge, run_values
from meml.core.io import DataError
from meml.core.precision import of_config
from meml.core.records import check_dataset_name
from meml.data.experts import prompts_of
from meml.plan.grid import (
    Cell,
    cell_key,
    cell_values,
    check_method,
    data_folder,
    sft_run,
    sft_variant,
    stage_seed,
    varies,
)
from meml.plan.layout import Layout
from meml.training.checkpoint import check_model_folder


def method_of(cfg: dict[str, Any], name: str) -> Any:
    """The named method's switches, checked (config `methods.<name>`)."""
    from meml.training.rl import Method

    if name not in cfg["methods"]:
        raise DataError(f"unknown method '{name}'; known: {', '.join(cfg['methods'])}", None, None, "methods")
    check_method(cfg, name, len(prompts_of(cfg)))
    return Method.from_config(name, cfg["methods"][name])


def rl_settings(cfg: dict[str, Any], values: dict[str, Any]) -> Any:
    """The RL loop's typed settings: the cell's values (grid.cell_values) and how the job runs (RUN_KEYS)."""
    from meml.training.rl import RLSettings

    return RLSettings.from_config(deep_merge(values["rl"], run_values(cfg, "rl")))


def reward_of(values: dict[str, Any]) -> RewardConfig:
    return RewardConfig(values["reward"]["mode"], values["reward"]["format_bonus"])


def sft(
    cfg: dict[str, Any],
    model: str,
    dataset: str,
    experts: list[int],
    *,
    results: str | None = None,
    model_dir: str | None = None,
    out: str | None = None,
    seed: int | None = None,
) -> tuple[dict[str, Any], Path]:
    """Multi-expert SFT of `model` on the experts' trajectories of `dataset`; with `seed` (where
    grid.seeds_vary retrains SFT) grid seed `seed`'s own run, from its own base, seeded by it."""
    from meml.training.sft import run_sft

    check_dataset_name(dataset, "--dataset")
    if seed is not None and not varies(cfg, "sft"):
        raise DataError("a seed's own SFT run needs sft in grid.seeds_vary", None, None, "grid.seeds_vary")
    layout = Layout.of(cfg, results)
    name = sft_variant(experts) if seed is None else sft_run(cfg, experts, seed)
    run = Path(out) if out else layout.sft(model, dataset, name)
    base = Path(model_dir) if model_dir else layout.base_model(cfg, model, seed)
    summary = run_sft(
        base,
        layout.data(cfg["world"], dataset, data_folder(cfg, seed)),
        layout.experts(cfg["world"], dataset, data_folder(cfg, seed)),
        run,
        experts,
        cfg["sft"],
        prompts_of(cfg),
        stage_seed(cfg, seed),
        of_config(cfg),
    )
    return summary, run


def rl(
    cfg: dict[str, Any], cell: Cell, *, results: str | None = None, sft_dir: str | None = None, out: str | None = None
) -> tuple[dict[str, Any], Path]:
    """One RL cell: the method's SFT model trained with the method's switches and the data set's
    RL settings, logged to the cell's MLflow run."""
    from meml.training.rl import RLArgs, RLPaths, run_rl

    check_dataset_name(cell.dataset, "--dataset")
    method = method_of(cfg, cell.method)
    layout = Layout.of(cfg, results)
    start = (
        Path(sft_dir)
        if sft_dir
        else layout.sft(cell.model, cell.dataset, sft_run(cfg, method.sft_experts, cell.seed)) / "model"
    )
    if not (start / "config.json").is_file():
        raise DataError("SFT model not found (run `meml sft` for this method first)", start)
    check_model_folder(start)  # weights present, and the SFT run that wrote them finished
    run = Path(out) if out else layout.rl(cell)
    # the one home of what defines the cell (plan/grid.cell_values): the RL loop's settings are taken
    # from it whole; it decides whether old checkpoints may be resumed, and is the MLflow run's params
    # (the rest of the config may change without touching the run)
    values = cell_values(cfg, cell)
    # a forced rerun (its DONE removed): the cell's evaluation belongs to the run being replaced
    evaluation = layout.eval(cell) if out is None else None
    stale = evaluation if evaluation and evaluation.is_file() and not (run / "DONE").is_file() else None
    asides = set((run / "previous").iterdir()) if (run / "previous").is_dir() else set()
    settings, prompts, reward = rl_settings(cfg, values), prompts_of(cfg), reward_of(values)
    args = RLArgs(settings, method, cell.seed, prompts, reward, of_config(cfg), values)
    folder = data_folder(cfg, cell.seed)
    paths = RLPaths(
        start, layout.data(cfg["world"], cell.dataset, folder), layout.experts(cfg["world"], cell.dataset, folder), run
    )
    where = {"model": cell.model, "dataset": cell.dataset, "method": cell.method, "seed": cell.seed}
    logged = tracking.RunTracking(
        cell_key(cfg, cell), {"cell": where, **values}, tracking.run_tags(cfg, cell), tracking.MLflowSettings.of(cfg)
    )
    summary = run_rl(args, paths, logged)
    new_aside = sorted(set((run / "previous").iterdir()) - asides) if (run / "previous").is_dir() else []
    if stale is not None and stale.is_file() and new_aside:  # kept with the run it measured
        stale.rename(new_aside[-1] / "eval.json")
    return summary, run


def trl(cfg: dict[str, Any], cell: Cell, *, results: str | None = None) -> tuple[dict[str, Any], Path]:
    """The cell trained by trl's GRPOTrainer from the same SFT model, on the same questions in the
    same order, with the cell's own values (training/trl_grpo.py says what is held equal)."""
    from meml.training.trl_grpo import TRLCell, run_trl_grpo

    check_dataset_name(cell.dataset, "--dataset")
    method = method_of(cfg, cell.method)
    layout = Layout.of(cfg, results)
    start = layout.sft(cell.model, cell.dataset, sft_run(cfg, method.sft_experts, cell.seed)) / "model"
    check_model_folder(start)
    values = cell_values(cfg, cell)
    args = TRLCell(rl_settings(cfg, values), method, cell.seed, prompts_of(cfg), reward_of(values), of_config(cfg),
                   bool(cfg["trl"]["vllm"]))  # fmt: skip
    data = layout.data(cfg["world"], cell.dataset, data_folder(cfg, cell.seed))
    run = layout.trl(cell)
    return run_trl_grpo(args, start, data, run), run
