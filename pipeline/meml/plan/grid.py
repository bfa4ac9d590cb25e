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

from meml.core.config import dataset_rl, method_rl, rollouts_per_expert, without_run_keys
from meml.core.io import DataError
from meml.data.tiny_models import folder_name, tiny_arch

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


# What a grid seed retrains (grid.seeds_vary). With [rl] every seed starts RL from the same SFT
# models, so a study's intervals say how much RL and the test sample move a comparison, given one
# draw of the models every method starts from; another run of the same config draws other models
# and the comparisons move by more than those intervals (issue 29's reruns). With sft (and
# pretrain) in the list, seed k trains its own SFT models (from its own pretrained tiny base),
# seeded with stage_seed: a seed is then an independent replicate of the whole chain, and the
# crossed seed x question interval covers every stage that varies. The data stay the same, so
# the methods are still compared on the same questions.
CHAIN_STRIDE = 1000  # seed k's pretraining and SFT seed: config seed + 1000 k (k = 0: the shared models')


def varies(cfg: dict[str, Any], stage: str) -> bool:
    """Whether a grid seed retrains this stage (pretrain, sft or rl), redraws its data (data) or draws
    a world of its own (world)."""
    return stage in cfg["grid"]["seeds_vary"]


def data_folder(cfg: dict[str, Any], seed: int | None) -> str:
    """The folder below results/<profile>/toy/ of grid seed `seed`'s own world where seeds redraw
    the data (grid.seeds_vary: data): seed3. Its training questions and expert trajectories are its
    own, its test questions the shared world's (or its own: grid.seeds_vary world). "" for the
    shared world."""
    return f"seed{seed}" if seed is not None and varies(cfg, "data") else ""


def test_folder(cfg: dict[str, Any], seed: int | None) -> str:
    """The folder below results/<profile>/<world>/ whose test questions grid seed `seed`'s models
    are evaluated on: the seed's own world where seeds draw their own (grid.seeds_vary: world),
    else the shared world's ("")."""
    return data_folder(cfg, seed) if varies(cfg, "world") else ""


def stage_seed(cfg: dict[str, Any], seed: int | None) -> int:
    """The seed of the pretraining and SFT that grid seed `seed` starts from (None: the shared ones)."""
    return int(cfg["seed"]) + (CHAIN_STRIDE * seed if seed is not None else 0)


def sft_run(cfg: dict[str, Any], experts: list[int] | tuple[int, ...], seed: int) -> str:
    """The SFT run a cell of this seed starts from, below sft/<model>/<ds>/: the variant (e0-e1-e2),
    or the variant and the seed (e0-e1-e2/seed3) where seeds retrain SFT."""
    variant = sft_variant(experts)
    return f"{variant}/seed{seed}" if varies(cfg, "sft") else variant


def run_seed(run: str) -> int | None:
    """The grid seed of an SFT run's name (e0-e1-e2/seed3 -> 3), None for a shared run."""
    _, _, seed = run.partition("/seed")
    return int(seed) if seed else None


def run_experts(run: str) -> list[int]:
    """The experts of an SFT run's name: e0-e1-e2/seed3 -> [0, 1, 2]."""
    return [int(k.lstrip("e")) for k in run.partition("/")[0].split("-")]


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


PAPER_EXPERTS = (0, 1, 2)


def complementarity_sft_variants(cfg: dict[str, Any]) -> list[str]:
    """The SFT runs the complementarity analysis samples: the MEF model (`source: mef`, one run for
    the three experts) or one single-expert model per expert (`single_expert`); where seeds
    retrain SFT, those of the first seed."""
    seed = cfg["grid"]["seeds"][0]
    if cfg["analysis"]["complementarity"]["source"] == "single_expert":
        return [sft_run(cfg, [k], seed) for k in PAPER_EXPERTS]
    return [sft_run(cfg, PAPER_EXPERTS, seed)]


def sft_variants(cfg: dict[str, Any]) -> list[str]:
    """The SFT runs the grid's methods and the complementarity analysis need (shared where the data is)."""
    needed = {sft_run(cfg, cfg["methods"][c.method]["sft_experts"], c.seed) for c in cells(cfg)}
    return sorted(needed | set(complementarity_sft_variants(cfg)))


def calibrated(cfg: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(model, data set, SFT run) of every MEF model some cell starts RL from: the gate's list."""
    return sorted(
        {(c.model, c.dataset, sft_run(cfg, cfg["methods"][c.method]["sft_experts"], c.seed)) for c in cells(cfg)}
    )


def tiny_folder(cfg: dict[str, Any], model: str) -> str | None:
    """The folder below results/<profile>/models/ of a tiny model (its arch, plus its tokenizer
    style unless toy: `qwen2`, `llama-llama-instruct`); None for a hub id or folder."""

    arch = tiny_arch(cfg, model)
    return folder_name(arch, cfg["models"][model]["tokenizer"]) if arch else None


SHOWN_ONLY = ("published", "published_note")  # model keys the report shows and no job reads


def model_values(entry: dict[str, Any]) -> dict[str, Any]:
    """A model entry without what is only shown (its published figures): what a job reads."""
    return {k: v for k, v in entry.items() if k not in SHOWN_ONLY}


def gguf_folder(cfg: dict[str, Any], model: str) -> str | None:
    """The folder below results/<profile>/models/ of a model converted from a GGUF file; None otherwise."""
    from meml.data import gguf_models

    entry = cfg["models"][model]
    if not gguf_models.is_gguf(entry["source"]):
        return None
    return gguf_models.folder_name(gguf_models.parse(entry, f"models.{model}"))


def hub_folder(cfg: dict[str, Any], model: str) -> str | None:
    """The folder below results/<profile>/models/ of a hub model pinned to a commit (models.<m>.revision),
    downloaded by the hub_model rule; None otherwise (an unpinned hub id is loaded by its id)."""
    from meml.data import hub_models

    entry = cfg["models"][model]
    if not entry.get("revision") or not hub_models.is_hub_id(str(entry["source"])):
        return None
    return hub_models.folder_name(str(entry["source"]), str(entry["revision"]))


def built_folder(cfg: dict[str, Any], model: str) -> str | None:
    """The folder below results/<profile>/models/ that a rule builds for this model (a tiny model,
    one converted from a GGUF file, a pinned hub model); None for an unpinned hub id or a folder."""
    return tiny_folder(cfg, model) or gguf_folder(cfg, model) or hub_folder(cfg, model)


def base_folder(cfg: dict[str, Any], model: str, seed: int | None = None) -> str | None:
    """The built folder a seed's SFT starts from: `built_folder`, below seed<k>/ where seeds retrain
    the pretrained tiny base (seed None: the first grid seed's; a GGUF model is never retrained)."""
    folder = built_folder(cfg, model)
    if folder and varies(cfg, "pretrain") and tiny_folder(cfg, model):
        return f"seed{cfg['grid']['seeds'][0] if seed is None else seed}/{folder}"
    return folder


def complementarity_models(cfg: dict[str, Any]) -> list[str]:
    chosen = cfg["analysis"]["complementarity"]["models"]
    return [m for m in models(cfg) if chosen is None or m in chosen]


def cell_values(cfg: dict[str, Any], cell: Cell) -> dict[str, Any]:
    """Every value that defines an RL cell's result. Snakemake reruns a cell when these change."""
    return {
        "world": cfg["world"],
        "model": cell.model,
        "model_source": cfg["models"][cell.model]["source"],
        "dataset": cell.dataset,
        "method": cell.method,
        "switches": switches(cfg, cell.method),
        "seed": cell.seed,
        # where the seed retrains SFT (and pretraining), the seed of those stages: another model
        **({"seeds_vary": cfg["grid"]["seeds_vary"]} if varies(cfg, "sft") else {}),
        "rl": without_run_keys("rl", method_rl(cfg, cell.method, cell.dataset)),
        "sft": without_run_keys("sft", cfg["sft"]),
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
    return f"{cfg['profile']}/{cell.path}#{params_hash(cell_values(cfg, cell))}"


def check(cfg: dict[str, Any], n_prompts: int) -> None:
    """Checks across keys that the JSON schema cannot express; each error names its key."""
    vary = cfg["grid"]["seeds_vary"]
    if (
        "rl" not in vary
        or ("pretrain" in vary and "sft" not in vary)
        or ("data" in vary and "sft" not in vary)
        or ("world" in vary and not {"data", "pretrain"} <= set(vary))
    ):
        raise DataError(
            f"seeds_vary {vary}: a seed always retrains RL, a seed that retrains pretraining retrains SFT "
            "from it, a seed that redraws the data retrains SFT and RL on them, and a seed that draws its own "
            "world redraws the data and retrains everything; use [rl], [sft, rl], [pretrain, sft, rl], "
            "[data, sft, rl], [data, pretrain, sft, rl] or [world, data, pretrain, sft, rl]",
            None,
            None,
            "grid.seeds_vary",
        )
    if "data" in vary and cfg["world"] != "toy":
        raise DataError(
            "seeds_vary [data] or [world]: only the toy world can draw new data; a real data set has one",
            None,
            None,
            "grid.seeds_vary",
        )
    check_stages(cfg)
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
    styles: dict[str, str] = {}
    for name, model in cfg["models"].items():
        arch = tiny_arch(cfg, name)
        if arch and styles.setdefault(arch, model["tokenizer"]) != model["tokenizer"]:
            raise DataError(
                f"two tiny {arch} models with different tokenizer styles are not supported; use one style per arch",
                None,
                None,
                f"models.{name}.tokenizer",
            )
    for name, model in cfg["models"].items():
        source = str(model["source"])
        if source.startswith("gguf:"):
            gguf_folder(cfg, name)  # parses the source and its checksums; a bad one names its key
        if source.startswith("tiny:") and source not in ("tiny:qwen2", "tiny:llama"):
            raise DataError(
                f"unknown tiny model '{source}'; known: tiny:qwen2, tiny:llama", None, None, f"models.{name}.source"
            )
        # the toy world's data sets are synthetic text a real model can read too: a model converted
        # from a GGUF file may train on them (config/real-learn.yaml); a hub model is the real world's
        if cfg["world"] == "toy" and not source.startswith(("tiny:", "gguf:")):
            raise DataError(
                "the toy world trains tiny models or a model from a GGUF file "
                "(source: tiny:qwen2, tiny:llama, gguf:...)",
                None,
                None,
                f"models.{name}.source",
            )
    if cfg["world"] == "real":
        from meml.data.teachers import settings_for

        for k in range(1, n_prompts):
            teacher = settings_for(cfg, k)  # every expert above 0 needs a teacher
            writes = teacher["backend"] != "jsonl" and int(teacher.get("max_tokens") or 0)
            if writes and writes > int(cfg["sft"]["max_length"]):
                raise DataError(
                    f"a teacher may write {teacher['max_tokens']} tokens but SFT keeps {cfg['sft']['max_length']} "
                    "(sft.max_length): the longest trajectories would lose their answer line",
                    None,
                    None,
                    f"teachers.e{k}.max_tokens",
                )
    check_lengths(cfg)
    for name in used_methods(cfg):
        check_method(cfg, name, n_prompts)
    for i, name in enumerate(cfg["trl"]["methods"]):
        if name not in used_methods(cfg):
            raise DataError(f"'{name}' is not one of the grid's methods", None, None, f"trl.methods[{i}]")
        if len(cfg["methods"][name]["rl_experts"]) != 1 or any(
            cfg["methods"][name].get(k) for k in ("iml", "hsft", "dynamic_sampling")
        ):
            raise DataError(
                f"trl's GRPOTrainer cannot run {name}: it has one prompt a group and no IML, HSFT or dynamic "
                "sampling (a one-expert method without them can be compared)",
                None,
                None,
                f"trl.methods[{i}]",
            )
        for ds in cfg["grid"]["datasets"]:
            if int(method_rl(cfg, name, ds)["updates_per_batch"]) != 1:
                raise DataError(
                    f"the trl comparison of {name} takes one update a batch (rl.updates_per_batch: 1)",
                    None,
                    None,
                    f"trl.methods[{i}]",
                )


# report.stages: runs of the same grid whose seeds retrain less (reporting/stages.py)
STAGE_SCOPES = {"pretrain": ["pretrain", "sft", "rl"], "sft": ["sft", "rl"], "rl": ["rl"]}


def check_stages(cfg: dict[str, Any]) -> None:
    """Each run named in report.stages must retrain less than this one, or it splits nothing off."""
    vary = cfg["grid"]["seeds_vary"]
    if cfg["report"]["stages"] and varies(cfg, "world"):
        key = next(iter(cfg["report"]["stages"]))
        raise DataError(
            "the stage split compares runs on the same test questions, and this run's seeds draw worlds of their "
            "own (grid.seeds_vary: world): run it on a design whose test questions are shared ([data, pretrain, "
            "sft, rl])",
            None,
            None,
            f"report.stages.{key}",
        )
    for key in cfg["report"]["stages"]:
        if not set(STAGE_SCOPES[key]) < set(vary):
            raise DataError(
                f"this run's seeds retrain {vary} (grid.seeds_vary): a run whose seeds retrain {STAGE_SCOPES[key]} "
                "splits nothing off it",
                None,
                None,
                f"report.stages.{key}",
            )
    if "sft" in cfg["report"]["stages"] and varies(cfg, "pretrain"):
        shared = [m for m in models(cfg) if not tiny_folder(cfg, m)]
        if shared:
            raise DataError(
                f"{', '.join(shared)}: a hub or GGUF model's base is never retrained, so there is no pretraining "
                "spread to split off; run the stage split on tiny models",
                None,
                None,
                "report.stages.sft",
            )


def check_lengths(cfg: dict[str, Any]) -> None:
    """Evaluation must let an answer run as long as RL does, on every data set."""
    cap = cfg["eval"]["max_new_tokens"]
    for ds in [None, *cfg["grid"]["datasets"]]:
        rl_cap = int(dataset_rl(cfg, ds)["max_new_tokens"])
        if cap is not None and int(cap) < rl_cap:
            raise DataError(
                f"evaluation stops at {cap} tokens but RL{f' on {ds}' if ds else ''} samples {rl_cap}: "
                "answers the model learnt to write would be cut at evaluation",
                None,
                None,
                "eval.max_new_tokens",
            )


def eval_max_new_tokens(cfg: dict[str, Any], dataset: str) -> int:
    """Evaluation's length cap on a data set: `eval.max_new_tokens`, or (null) the data set's RL cap,
    so an answer may run at evaluation exactly as long as it could in training."""
    return int(cfg["eval"]["max_new_tokens"] or dataset_rl(cfg, dataset)["max_new_tokens"])


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
    for dataset in [None, *(cfg.get("rl_by_dataset") or {})]:
        rl = method_rl(cfg, name, dataset)
        rollouts_per_expert(int(rl["group_size"]), len(entry["rl_experts"]), rl["spread"], name)
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
