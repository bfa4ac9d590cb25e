"""The experiment grid: models x data sets x methods x seeds, read from the config.

Snakemake (the Snakefile) and the CLI both ask this module what the cells are, where their files
go and which values define them, so the two can never disagree. `check` runs the checks that the
JSON schema cannot express (a grid entry naming an unknown method, an expert without a prompt)
and names the offending key, before any job starts.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from .io import DataError

TABLES = ("main", "ablation", "vote", "curves")
EXTRA_TABLES = ("gain", "drgrpo", "experts", "compute", "sensitivity", "dynamic")


@dataclass(frozen=True)
class Cell:
    """One RL run: a model trained on a data set with a method and a seed."""

    model: str
    dataset: str
    method: str
    seed: int

    @property
    def path(self) -> str:
        """The cell's folder below results/<profile>/rl/ (and its eval file's stem below eval/)."""
        return f"{self.model}/{self.dataset}/{self.method}/seed{self.seed}"


def sft_variant(experts: list[int] | tuple[int, ...]) -> str:
    """The name of an SFT run by the experts whose trajectories it trains on: e0-e1-e2."""
    return "-".join(f"e{k}" for k in sorted(experts))


def models(cfg: dict[str, Any]) -> list[str]:
    return list(cfg["grid"]["models"] or cfg["models"])


def methods(cfg: dict[str, Any]) -> list[str]:
    return list(cfg["grid"]["methods"] or cfg["methods"])


def extra_models(cfg: dict[str, Any]) -> list[str]:
    return list(cfg["extras"]["models"] or models(cfg))


def used_methods(cfg: dict[str, Any]) -> list[str]:
    """The grid's methods, then the extras' (each once), in that order."""
    return list(dict.fromkeys([*methods(cfg), *cfg["extras"]["methods"]]))


def cells(cfg: dict[str, Any]) -> list[Cell]:
    """The grid's cells, then the extras' cells (extras.models x extras.datasets x extras.methods)."""
    main = [
        Cell(m, ds, method, seed)
        for m in models(cfg)
        for ds in cfg["grid"]["datasets"]
        for method in methods(cfg)
        for seed in cfg["grid"]["seeds"]
    ]
    extra = [
        Cell(m, ds, method, seed)
        for m in extra_models(cfg)
        for ds in cfg["extras"]["datasets"]
        for method in cfg["extras"]["methods"]
        for seed in cfg["grid"]["seeds"]
    ]
    return list(dict.fromkeys([*main, *extra]))


def eval_experts(cfg: dict[str, Any], method: str) -> list[int]:
    switches = cfg["methods"][method]
    return sorted(switches.get("eval_experts") or switches["rl_experts"])


def tables_of(cfg: dict[str, Any], method: str) -> list[str]:
    return list(cfg["methods"][method].get("tables") or ["main"])


def sft_variants(cfg: dict[str, Any]) -> list[str]:
    """The MEF runs the grid's methods need (methods sharing SFT data share the run)."""
    return sorted({sft_variant(cfg["methods"][m]["sft_experts"]) for m in used_methods(cfg)})


def tiny_arch(cfg: dict[str, Any], model: str) -> str | None:
    """`tiny:qwen2` -> "qwen2"; None for a hub id or folder."""
    source = str(cfg["models"][model]["source"])
    return source.split(":", 1)[1] if source.startswith("tiny:") else None


def complementarity_models(cfg: dict[str, Any]) -> list[str]:
    chosen = cfg["analysis"]["complementarity"]["models"]
    return [m for m in models(cfg) if chosen is None or m in chosen]


def method_rl(cfg: dict[str, Any], method: str) -> dict[str, Any]:
    """The RL settings a method runs with: `rl`, with the method's own `rl` overrides laid over it."""
    from .config import deep_merge

    return deep_merge(cfg["rl"], cfg["methods"][method].get("rl") or {})


def cell_params(cfg: dict[str, Any], cell: Cell) -> dict[str, Any]:
    """Every value that defines an RL cell's result. Snakemake reruns a cell when these change."""
    return {
        "world": cfg["world"],
        "model": cell.model,
        "model_source": cfg["models"][cell.model]["source"],
        "dataset": cell.dataset,
        "method": cell.method,
        "switches": switches(cfg, cell.method),
        "seed": cell.seed,
        "rl": method_rl(cfg, cell.method),
        "sft": cfg["sft"],
        "reward": cfg["reward"],
        "prompts": cfg["experts"].get("prompts"),
    }


def switches(cfg: dict[str, Any], method: str) -> dict[str, Any]:
    """A method's entry without `tables`: where a method is shown does not change its result."""
    return {k: v for k, v in cfg["methods"][method].items() if k != "tables"}


def params_hash(params: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:10]


def cell_key(cfg: dict[str, Any], cell: Cell) -> str:
    """The MLflow tag that finds a cell's run again: readable path plus a hash of its values,
    so a re-run with the same values reuses the run and changed values get a run of their own."""
    return f"{cfg['profile']}/{cell.path}#{params_hash(cell_params(cfg, cell))}"


def check(cfg: dict[str, Any], n_prompts: int) -> None:
    """Checks across keys that the JSON schema cannot express; each error names its key."""
    for section in ("grid", "extras"):
        for i, name in enumerate(cfg[section]["methods"] or []):
            if name not in cfg["methods"]:
                known = ", ".join(cfg["methods"])
                raise DataError(f"unknown method '{name}'; known: {known}", None, None, f"{section}.methods[{i}]")
    for i, name in enumerate(cfg["extras"]["models"] or []):
        if name not in models(cfg):
            raise DataError(f"'{name}' is not one of the grid's models", None, None, f"extras.models[{i}]")
    for i, name in enumerate(cfg["extras"]["datasets"]):
        if cfg["extras"]["methods"] and name not in cfg["grid"]["datasets"]:
            # the extra tables compare with the grid's methods on the same data sets
            raise DataError(f"'{name}' is not one of grid.datasets", None, None, f"extras.datasets[{i}]")
    for i, name in enumerate(cfg["grid"]["models"] or []):
        if name not in cfg["models"]:
            known = ", ".join(cfg["models"])
            raise DataError(f"unknown model '{name}'; known: {known}", None, None, f"grid.models[{i}]")
    for i, name in enumerate(cfg["analysis"]["complementarity"]["models"] or []):
        if name not in cfg["models"]:
            raise DataError(f"unknown model '{name}'", None, None, f"analysis.complementarity.models[{i}]")
    for name, model in cfg["models"].items():
        source = str(model["source"])
        if source.startswith("tiny:") and source not in ("tiny:qwen2", "tiny:llama"):
            raise DataError(
                f"unknown tiny model '{source}'; known: tiny:qwen2, tiny:llama", None, None, f"models.{name}.source"
            )
        if cfg["world"] == "toy" and not source.startswith("tiny:"):
            raise DataError(
                "the toy world trains tiny models only (source: tiny:qwen2 or tiny:llama)",
                None,
                None,
                f"models.{name}.source",
            )
    if cfg["world"] == "real":
        from .teachers import settings_for

        for k in range(1, n_prompts):
            settings_for(cfg, k)  # every expert above 0 needs a teacher
    for name in used_methods(cfg):
        check_method(cfg, name, n_prompts)


def check_method(cfg: dict[str, Any], name: str, n_prompts: int) -> None:
    """The checks of one method's entry (the CLI runs these for the method it is asked to run)."""
    headline = cfg["report"]["headline_expert"]
    entry = cfg["methods"][name]
    for key in ("sft_experts", "rl_experts", "eval_experts"):
        bad = [k for k in entry.get(key) or [] if k >= n_prompts]
        if bad:
            raise DataError(
                f"expert(s) {bad} are not in this world (experts 0..{n_prompts - 1}; see experts.count)",
                None,
                None,
                f"methods.{name}.{key}",
            )
    _check_rl_override(cfg, name)
    if set(tables_of(cfg, name)) & {"main", "ablation", *EXTRA_TABLES} and headline not in eval_experts(cfg, name):
        raise DataError(
            f"the tables report expert {headline} (report.headline_expert), which this method does not evaluate",
            None,
            None,
            f"methods.{name}.eval_experts",
        )
    if "vote" in tables_of(cfg, name) and len(eval_experts(cfg, name)) < 2:
        raise DataError(
            "a majority vote needs two or more evaluated experts", None, None, f"methods.{name}.eval_experts"
        )


def _check_rl_override(cfg: dict[str, Any], name: str) -> None:
    """A method's `rl` overrides, merged into `rl`, must pass the schema of `rl` itself."""
    import jsonschema
    import yaml

    from .config import SCHEMA_PATH

    if not cfg["methods"][name].get("rl"):
        return
    schema = yaml.safe_load(SCHEMA_PATH.read_text())["properties"]["rl"]
    for err in jsonschema.Draft202012Validator(schema).iter_errors(method_rl(cfg, name)):
        key = ".".join([f"methods.{name}.rl", *(str(p) for p in err.path)])
        raise DataError(f"invalid RL override: {err.message}", None, None, key)
