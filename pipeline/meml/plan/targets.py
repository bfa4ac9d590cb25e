"""Targets named on the command line (or with --forcerun), checked against the config before any
job: a cell's output under results/<profile>/ whose model, data set, method or seed this config
does not have gets one line naming the wrong part and the valid values, instead of Snakemake's
"No rule to produce".

    check(cfg, ["results/toy/rl/qwen2/gsm8k/MEML-GPRO/seed0/DONE"])
    -> DataError: target results/toy/rl/qwen2/gsm8k/MEML-GPRO/seed0/DONE: unknown method 'MEML-GPRO';
       this config's methods: MEML-GRPO, ...
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import PurePosixPath
from typing import Any

from meml.core.io import DataError
from meml.plan.layout import RESULTS, Layout

DATASETS = ("gsm8k", "strategyqa", "mathqa")
# the results/<profile>/<stage>/ folders whose paths name a cell: model/dataset/method/seed<k>
CELL_STAGES = ("rl", "eval")
# the entries of eval/<model>/<ds>/ that are no cell's, as Layout spells them: the base model's
# evaluation (eval.base) and the SFT models' folder (eval.sft)
_PROBE = Layout(RESULTS)
NOT_CELLS = (_PROBE.eval_base("m", "d").name, _PROBE.eval_sft("m", "d", "v").parent.name)


def _problem(cfg: dict[str, Any], parts: list[str]) -> str | None:
    """What is wrong with a path's parts after results/<profile>/, or None."""
    stage, rest = parts[0], parts[1:]
    if stage not in (*CELL_STAGES, "sft", "calibration") or not rest:
        return None
    model = rest[0]
    if model not in cfg["models"]:
        return f"unknown model '{model}'; this config's models: {', '.join(cfg['models'])}"
    if len(rest) > 1 and rest[1] not in DATASETS:
        return f"unknown data set '{rest[1]}'; the data sets: {', '.join(DATASETS)}"
    if stage == "eval" and len(rest) > 2 and rest[2] in NOT_CELLS:
        return None
    if stage in CELL_STAGES and len(rest) > 2:
        method = rest[2]
        if method not in cfg["methods"]:
            return f"unknown method '{method}'; this config's methods: {', '.join(cfg['methods'])}"
        if len(rest) > 3:
            seed = rest[3].removesuffix(".json")
            seeds = [f"seed{s}" for s in cfg["grid"]["seeds"]]
            if seed not in seeds:
                return f"unknown seed '{seed}'; this config's seeds (grid.seeds): {', '.join(seeds)}"
    return None


def named_on(argv: Iterable[str]) -> list[str]:
    """The results/ paths of a command line: targets, and the values of options such as --forcerun
    (also written --forcerun=PATH)."""
    out = []
    for arg in argv:
        value = arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg
        if value.startswith(f"{RESULTS}/"):
            out.append(value)
    return out


def check(cfg: dict[str, Any], targets: Iterable[str]) -> None:
    """Raise DataError for the first target that names something this config does not have."""
    profile = cfg["profile"]
    for target in targets:
        parts = list(PurePosixPath(str(target)).parts)
        if len(parts) < 3 or parts[0] != str(RESULTS):
            continue  # a rule name, the report, a file outside results/: Snakemake's own checks
        if parts[1] != profile:
            raise DataError(
                f"target {target}: profile '{parts[1]}' is not this config's ('{profile}'); "
                f"name {RESULTS}/{profile}/..., or pass the config whose profile it is (--configfile)"
            )
        problem = _problem(cfg, parts[2:])
        if problem:
            raise DataError(f"target {target}: {problem}")
