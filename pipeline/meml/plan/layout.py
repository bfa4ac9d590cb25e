"""Where every file of a profile lives: the one place that spells the results layout (the Snakemake
rules take their inputs' and outputs' paths from here too, with wildcards for names: WILDCARD_CELL).

    results/<profile>/
        <world>/data/<ds>/{train,test}.jsonl      prepared records (world: toy or real)
        <world>/experts/<ds>/e<k>.jsonl           expert trajectories
        real/lengths/<model>/<ds>.json            their lengths against RL's cap, checked before SFT
        toy/seed<k>/{data,experts,raw}/           seed k's own training data (grid.seeds_vary: data)
        models/<name>/                            tiny models (toy world and real-smoke), models from GGUF files
        models/seed<k>/<name>/                    seed k's own pretrained tiny model (grid.seeds_vary: pretrain)
        sft/<model>/<ds>/<variant>/{model,DONE}   MEF runs (variant: the experts, e.g. e0-e1-e2)
        sft/<model>/<ds>/<variant>/seed<k>/...    seed k's own SFT run (grid.seeds_vary: sft)
        calibration/<model>/<ds>/<run>.json       the gate's measurements (run: the SFT run's name)
        rl/<model>/<ds>/<method>/seed<k>/         RL runs (metrics.jsonl, model/, DONE)
        eval/<model>/<ds>/<method>/seed<k>.json   evaluations, every response kept
        analysis/complementarity/<model>_<ds>.*   the complementarity analysis
        mlflow_experiment.json, report_run/       the MLflow experiment; the report's run
        cost_throughput.json                      `meml cost --measure`'s timed steps
    report/<profile>/{index.md,tables,figures}    what the report writes
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meml.core.io import DataError
from meml.plan.grid import Cell, base_folder

RESULTS = Path("results")  # relative to the folder Snakemake runs in
# A cell whose names are Snakemake's wildcards: Layout's paths for it are the rules' patterns.
WILDCARD_CELL = Cell("{model}", "{ds}", "{method}", "{seed}")  # type: ignore[arg-type]
AGREEMENT = RESULTS / "agreement"  # `meml agreement`: the checker against the real rationales


@dataclass(frozen=True)
class Layout:
    root: Path  # results/<profile>

    @classmethod
    def of(cls, cfg: dict[str, Any], results: str | Path | None = None) -> Layout:
        return cls(Path(results) if results else RESULTS / cfg["profile"])

    def world(self, world: str, sub: str = "") -> Path:
        """A world's folder; `sub` (seed3, grid.data_folder) a grid seed's own toy world inside it."""
        return self.root / world / sub if sub else self.root / world

    def data_root(self, world: str, sub: str = "") -> Path:
        """The prepared data sets of a world (one folder per data set inside)."""
        return self.world(world, sub) / "data"

    def data(self, world: str, dataset: str, sub: str = "") -> Path:
        return self.data_root(world, sub) / dataset

    def experts(self, world: str, dataset: str, sub: str = "") -> Path:
        return self.world(world, sub) / "experts" / dataset

    def lengths(self, model: str, dataset: str) -> Path:
        """The check of the real world's trajectories against RL's cap, in the model's tokenizer
        (rule trajectory_lengths, between the teachers and SFT)."""
        return self.world("real") / "lengths" / model / f"{dataset}.json"

    @property
    def models(self) -> Path:
        return self.root / "models"

    def base_model(self, cfg: dict[str, Any], model: str, seed: int | None = None) -> Path | str:
        """A built model's folder (tiny, or converted from a GGUF file; a seed's own where seeds
        retrain pretraining), or the hub id / folder of a real one."""
        if model not in cfg["models"]:
            raise DataError(f"unknown model '{model}'; known: {', '.join(cfg['models'])}", None, None, "models")
        folder = base_folder(cfg, model, seed)
        return self.models / folder if folder else str(cfg["models"][model]["source"])

    def sft(self, model: str, dataset: str, variant: str) -> Path:
        return self.root / "sft" / model / dataset / variant

    def calibration(self, model: str, dataset: str, variant: str) -> Path:
        return self.root / "calibration" / model / dataset / f"{variant}.json"

    def rl(self, cell: Cell) -> Path:
        return self.root / "rl" / cell.path

    def eval(self, cell: Cell) -> Path:
        return self.root / "eval" / f"{cell.path}.json"

    def trl(self, cell: Cell) -> Path:
        """The cell trained by trl's GRPOTrainer (trl.methods): DONE, metrics.jsonl, model/, eval.json."""
        return self.root / "trl" / cell.path

    def eval_base(self, model: str, dataset: str) -> Path:
        """The base model's evaluation before any training (eval.base)."""
        return self.root / "eval" / model / dataset / "base.json"

    def eval_sft(self, model: str, dataset: str, variant: str) -> Path:
        """An SFT model's evaluation, the start of the RL cells it feeds (eval.sft): sft/e0-e1-e2.json,
        or sft/e0-e1-e2/seed3.json where seeds retrain SFT."""
        return self.root / "eval" / model / dataset / "sft" / f"{variant}.json"

    def complementarity(self, model: str, dataset: str, ext: str = "json") -> Path:
        """The analysis's .json, .png or .pdf (beside each other)."""
        return self.root / "analysis" / "complementarity" / f"{model}_{dataset}.{ext}"

    def standin_byo(self) -> Path:
        """real-smoke's bring-your-own trajectory files (<ds>/e<k>.jsonl inside), written by the workflow."""
        return self.root / "standin_byo"

    @property
    def mlflow_marker(self) -> Path:
        return self.root / "mlflow_experiment.json"

    @property
    def report_run(self) -> Path:
        return self.root / "report_run"


def report_dir(cfg: dict[str, Any]) -> Path:
    return Path("report") / cfg["profile"]


def default_data_root(world: str) -> str:
    """The prepared data an lm-eval task reads when no data_root is passed: the default profile of
    each world (toy, and paper for the real world)."""
    return str(Layout(RESULTS / ("toy" if world == "toy" else "paper")).data_root(world))


def replicates_on_disk(cfg: dict[str, Any], cells: list[Cell]) -> list[str]:
    """The other runs of this study the report pools (report.replicates, less this run's own profile):
    those on disk now. A replicate counts once every one of its evaluations is there: one run in part
    is left out, not waited for. (`make study` runs the study, then its replica, then the study's DAG
    again, whose report then pools the replica: a new input, so Snakemake reruns the report alone.)"""
    return [
        name
        for name in cfg["report"]["replicates"]
        if name != cfg["profile"] and all(replicate_eval(name, c).is_file() for c in cells)
    ]


def replicate_eval(profile: str, cell: Cell) -> Path:
    """A cell's evaluation in another run (profile) of the same study."""
    return RESULTS / profile / "eval" / f"{cell.path}.json"
