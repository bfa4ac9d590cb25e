"""What the data commands run (`meml toy-world`, `tiny-models`, `prepare`, `teach`): a config and a
few names in; the data stage's function called with the config's settings."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from meml.core import tracking
from meml.core.io import atomic_write_json
from meml.core.records import Record, check_dataset_name, read_records, write_records
from meml.data.experts import prompts_of
from meml.plan import grid


def toy_world(cfg: dict[str, Any], out: str, draw: int | None = None) -> list[dict[str, Any]]:
    """The toy world of the config's seed; with `draw` (a grid seed, grid.seeds_vary: data) that
    seed's own world: the grid's data sets get its own training questions and trajectories, and
    with grid.seeds_vary: world its own test questions and StrategyQA creatures too."""
    from meml.data.toy.world import build_world

    sizes = {ds: tuple(v) for ds, v in cfg["toy"]["sizes"].items()}
    toy = cfg["toy"]
    return build_world(
        out, cfg["seed"], sizes, len(prompts_of(cfg)), toy["gsm8k_max_ops"], toy["mathqa_small"],  # type: ignore[arg-type]
        draw, tuple(cfg["grid"]["datasets"]) if draw is not None else (), grid.varies(cfg, "world"),
        toy["strategyqa_per_kind"],
    )  # fmt: skip


def tiny_models(cfg: dict[str, Any], root: str, out: str, model_seed: int | None = None) -> dict[str, Path]:
    """The tokenizer trained on the world's texts, and every tiny model the config names, initialised
    and pretrained from `model_seed` (default: the config's seed; a grid seed's own base: the CLI
    passes its stage seed, meml.plan.grid.stage_seed)."""
    from meml.data.tiny_models import build_tiny_models, tiny_arch, toy_corpus

    model_seed = cfg["seed"] if model_seed is None else model_seed

    corpus = toy_corpus(root, prompts_of(cfg), with_experts=cfg["world"] == "toy")
    # tiny arch -> tokenizer style, of every tiny model in the config
    styles = {arch: cfg["models"][m]["tokenizer"] for m in cfg["models"] if (arch := tiny_arch(cfg, m))}
    pretraining = dict(cfg["toy"]["pretrain"])
    if pretraining["steps"] > 0:
        from meml.data.pretrain import corpus as pretraining_corpus
        from meml.data.pretrain import read_knowledge_base

        domains = pretraining["domains"]
        tests = [Path(root) / "data" / ds / "test.jsonl" for ds in domains]
        exclude = [r.question for test in tests if test.exists() for r in read_records(test)]
        kb = read_knowledge_base(root) if "strategyqa" in domains else []
        pretraining["texts"] = pretraining_corpus(
            exclude, model_seed, pretraining["documents"], cfg["toy"]["gsm8k_max_ops"], domains=domains,
            knowledge_base=kb, mathqa_small=cfg["toy"]["mathqa_small"],
            strategyqa_per_kind=cfg["toy"]["strategyqa_per_kind"],
        )  # fmt: skip
    return build_tiny_models(corpus, out, model_seed, cfg["toy"]["vocab_size"], list(styles), styles, pretraining)


def prepare(cfg: dict[str, Any], dataset: str, out: str, local: str | None = None) -> dict[str, list[Record]]:
    """A real data set (hub id or local folder) as prepared records; `data.<ds>.sizes` keeps the
    first N of each split, with their real ids."""
    from meml.data.loaders import load_real

    check_dataset_name(dataset, "--dataset")
    settings = dict(cfg["data"].get(dataset, {}))
    if local:
        settings["local"] = local
    records = load_real(dataset, settings)
    sizes = settings.get("sizes")
    chosen = {}
    for i, split in enumerate(("train", "test")):
        chosen[split] = [r for r in records if r.split == split][: sizes[i] if sizes else None]
        write_records(Path(out) / dataset / f"{split}.jsonl", chosen[split])
    return chosen


def teach(cfg: dict[str, Any], dataset: str, expert: int, root: Path) -> dict[str, Any]:
    """Expert k's trajectories from its teacher (`teachers.e<k>`), in the real world below `root`."""
    from meml.data.teachers import OpenAITeacher, build_expert, settings_for

    settings = settings_for(cfg, expert)
    with contextlib.ExitStack() as stack:
        teacher, server = None, None
        if settings.get("standin"):  # a local stand-in on 127.0.0.1 (config/real-smoke.yaml)
            from meml.data.standin import StandinServer

            server = StandinServer(read_records(root / "data" / dataset / "train.jsonl", dataset))
            teacher = OpenAITeacher({**settings, "base_url": stack.enter_context(server)})
        summary = build_expert(
            root / "data" / dataset,
            dataset,
            expert,
            settings,
            root / "experts" / dataset,
            root / "teacher_cache",
            prompts_of(cfg),
            teacher=teacher,
        )
        if server is not None:  # what the server answered, beside the stats it should match
            atomic_write_json(root / "experts" / dataset / f"e{expert}.standin.json", server.answered)
    if tracking.MLflowSettings.of(cfg).enabled:
        tracking.log_teacher(cfg, root / "teacher_runs" / dataset / f"e{expert}", dataset, expert, settings, summary)
    return summary
