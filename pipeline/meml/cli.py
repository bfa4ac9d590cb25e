"""Command-line entry points (also what the Snakemake rules call). `meml --help` lists them.

meml toy-world    build the toy data sets and expert trajectories
meml toy-stats    print the toy world's statistics
meml tiny-models  train the tokenizer and save the two tiny models
meml prepare      load a real data set (hub id or local folder) into prepared JSONL
meml agreement    check the answer checker against real gold rationales
meml cost         estimate the GPU-hours of the grid (`--measure` times a few RL steps here first)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from .io import DataError, atomic_write_json, atomic_write_text
from .layout import Layout, report_dir
from .precision import of_config


def _overrides(pairs: list[str]) -> dict[str, Any]:
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise DataError(f"override must look like key.sub=value, got {pair!r}")
        key, value = pair.split("=", 1)
        out[key] = yaml.safe_load(value)
    return out


def _config(args: argparse.Namespace) -> dict[str, Any]:
    from .config import load_config

    overrides = _overrides(args.set or [])
    if getattr(args, "config_json", None):
        # the Snakemake rules pass the config sections a job reads as one JSON mapping
        sections = json.loads(args.config_json)
        if not isinstance(sections, dict):
            raise DataError("--config-json must be a JSON mapping of top-level config keys")
        overrides = {**sections, **overrides}
    return load_config(args.config, overrides)


def cmd_toy_world(args: argparse.Namespace) -> None:
    from .toy.world import build_world

    cfg = _config(args)
    sizes = {ds: tuple(v) for ds, v in cfg["toy"]["sizes"].items()}
    built = build_world(args.out, cfg["seed"], sizes, len(_prompts(cfg)), cfg["toy"]["gsm8k_max_ops"])  # type: ignore[arg-type]
    for summary in built:
        print(f"{summary['dataset']}: {summary['train']} train / {summary['test']} test -> {args.out}")


def cmd_toy_stats(args: argparse.Namespace) -> None:
    from .toy.stats import format_stats, world_stats

    stats = world_stats(args.root)
    text = format_stats(stats)
    print(text)
    if args.out:
        atomic_write_json(Path(args.out).with_suffix(".json"), stats)
        atomic_write_text(Path(args.out).with_suffix(".md"), text + "\n")


def cmd_tiny_models(args: argparse.Namespace) -> None:
    from .grid import tiny_arch
    from .tiny_models import build_tiny_models, toy_corpus

    cfg = _config(args)
    corpus = toy_corpus(args.root, _prompts(cfg), with_experts=cfg["world"] == "toy")
    # tiny arch -> tokenizer style, of every tiny model in the config
    styles = {arch: cfg["models"][m].get("tokenizer", "toy") for m in cfg["models"] if (arch := tiny_arch(cfg, m))}
    built = build_tiny_models(corpus, args.out, cfg["seed"], cfg["toy"]["vocab_size"], list(styles), styles)
    for name, folder in built.items():
        print(f"{name}: {folder}")


def cmd_prepare(args: argparse.Namespace) -> None:
    from .loaders import load_real
    from .records import check_dataset_name, write_records

    cfg = _config(args)
    check_dataset_name(args.dataset, "--dataset")
    settings = dict(cfg["data"].get(args.dataset, {}))
    if args.local:
        settings["local"] = args.local
    records = load_real(args.dataset, settings)
    sizes = settings.get("sizes")  # the first N of each split: real records, ids and splits kept
    for i, split in enumerate(("train", "test")):
        chosen = [r for r in records if r.split == split][: sizes[i] if sizes else None]
        write_records(Path(args.out) / args.dataset / f"{split}.jsonl", chosen)
        print(f"{args.dataset} {split}: {len(chosen)} records")


def cmd_agreement(args: argparse.Namespace) -> None:
    from .agreement import format_report, run

    root = Path(args.datasets)
    if not root.is_dir():
        raise DataError("real data sets folder not found (expected ../shared/datasets beside the project)", root)
    report = run(root, args.out)
    text = format_report(report)
    print(text)
    atomic_write_text(Path(args.out) / "agreement.md", text + "\n")


def _method(cfg: dict[str, Any], name: str) -> Any:
    from .grid import check_method
    from .rl import Method

    if name not in cfg["methods"]:
        raise DataError(f"unknown method '{name}'; known: {', '.join(cfg['methods'])}", None, None, "methods")
    check_method(cfg, name, len(_prompts(cfg)))
    return Method.from_config(name, cfg["methods"][name])


def _prompts(cfg: dict[str, Any]) -> tuple[str, ...]:
    from .experts import prompts_of

    return prompts_of(cfg)


def _mlflow_settings(cfg: dict[str, Any]) -> dict[str, Any]:
    """`mlflow`, with the experiment named after the profile unless set: one experiment per profile,
    described on its page in the UI."""
    world = "toy world (synthetic data sets, tiny models, CPU)" if cfg["world"] == "toy" else "real data sets"
    description = (
        f"MEML-GRPO reproduction, profile '{cfg['profile']}': {world}. One run per cell "
        "(model x data set x method x seed); group by the tags model, dataset, method, advantage, iml, hsft. "
        f"Tables and figures: report/{cfg['profile']}/index.md, and the '{cfg['profile']}/report' run's artifacts."
    )
    return {**cfg["mlflow"], "experiment": cfg["mlflow"]["experiment"] or cfg["profile"], "description": description}


def run_tags(cfg: dict[str, Any], cell: Any) -> dict[str, str]:
    """The tags a cell's MLflow run carries, so that the UI's "Group by" and search work on the
    grid's dimensions and the method's switches without knowing the cell-key format."""
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


def _world(cfg: dict[str, Any], results: str | None = None) -> Path:
    """The data sets and expert trajectories of this config's world (layout.py)."""
    return Layout.of(cfg, results).world(cfg["world"])


def _paths(cfg: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Where a job's inputs live (layout.py): the layout, the data set's records and trajectories."""
    layout = Layout.of(cfg, args.results)
    return {
        "layout": layout,
        "data": layout.data(cfg["world"], args.dataset),
        "experts": layout.experts(cfg["world"], args.dataset),
        "models": layout.models,
    }


def _base_model(cfg: dict[str, Any], paths: dict[str, Any], model: str) -> Path | str:
    """A tiny model's folder, or the hub id / folder of a real one."""
    from .grid import tiny_folder

    if model not in cfg["models"]:
        raise DataError(f"unknown model '{model}'; known: {', '.join(cfg['models'])}", None, None, "models")
    folder = tiny_folder(cfg, model)
    return paths["models"] / folder if folder else str(cfg["models"][model]["source"])


def cmd_sft(args: argparse.Namespace) -> None:
    from .grid import sft_variant
    from .records import check_dataset_name
    from .sft import run_sft

    cfg = _config(args)
    check_dataset_name(args.dataset, "--dataset")
    experts = [int(k) for k in args.experts.split(",")] if args.experts else list(_method(cfg, args.method).sft_experts)
    paths = _paths(cfg, args)
    model_dir = Path(args.model_dir) if args.model_dir else _base_model(cfg, paths, args.model)
    out = Path(args.out) if args.out else paths["layout"].sft(args.model, args.dataset, sft_variant(experts))
    summary = run_sft(
        model_dir, paths["data"], paths["experts"], out, experts, cfg["sft"], _prompts(cfg), cfg["seed"], of_config(cfg)
    )
    print(f"SFT {sft_variant(experts)} on {args.dataset}: loss {summary['train_loss']} -> {out}")


def cmd_rl(args: argparse.Namespace) -> None:
    from .grid import Cell, cell_key, cell_params, method_rl, sft_variant
    from .records import check_dataset_name
    from .rl import run_rl

    cfg = _config(args)
    check_dataset_name(args.dataset, "--dataset")
    method = _method(cfg, args.method)
    paths = _paths(cfg, args)
    cell = Cell(args.model, args.dataset, args.method, args.seed)
    default_sft = paths["layout"].sft(args.model, args.dataset, sft_variant(method.sft_experts)) / "model"
    sft_dir = Path(args.sft_dir) if args.sft_dir else default_sft
    if not (sft_dir / "config.json").is_file():
        raise DataError("SFT model not found (run `meml sft` for this method first)", sft_dir)
    from .evaluate import check_checkpoint

    check_checkpoint(sft_dir)  # weights present, and the SFT run that wrote them finished
    out = Path(args.out) if args.out else paths["layout"].rl(cell)
    mlflow_settings = _mlflow_settings(cfg)
    summary = run_rl(
        method_rl(cfg, args.method, args.dataset),
        method,
        sft_dir,
        paths["data"],
        paths["experts"],
        out,
        seed=args.seed,
        prompts=_prompts(cfg),
        reward_mode=cfg["reward"]["mode"],
        format_bonus=cfg["reward"]["format_bonus"],
        cell_key=cell_key(cfg, cell),
        # the values that define the cell decide whether old checkpoints may be resumed, and are
        # the MLflow run's params (the rest of the config may change without touching the run)
        params=cell_params(cfg, cell),
        mlflow_params={
            "cell": {"model": cell.model, "dataset": cell.dataset, "method": cell.method, "seed": cell.seed},
            **cell_params(cfg, cell),
        },
        mlflow_settings=mlflow_settings,
        mlflow_tags=run_tags(cfg, cell),
        precision=of_config(cfg),
    )
    print(
        f"RL {args.method} on {args.dataset}: reward {summary['reward_first']:.3f} -> "
        f"{summary['reward_last']:.3f} -> {out}"
    )


def cmd_cost(args: argparse.Namespace) -> None:
    import tempfile

    from .cost import estimate, measure, save_measured, table, throughputs

    cfg = _config(args)
    measured = Layout.of(cfg, args.results).root / "cost_throughput.json"
    if args.measure:
        with tempfile.TemporaryDirectory() as work:
            save_measured(measured, measure(cfg, Path(work), args.steps))
    speeds = throughputs(cfg, measured)
    text = table(estimate(cfg, speeds), speeds)
    print(text)
    if args.out:
        atomic_write_text(Path(args.out), text + "\n")


def cmd_eval(args: argparse.Namespace) -> None:
    from .evaluate import evaluate
    from .grid import eval_max_new_tokens
    from .records import check_dataset_name

    cfg = _config(args)
    check_dataset_name(args.dataset, "--dataset")
    experts = [int(k) for k in args.experts.split(",")]
    data_root = Path(args.data_root) if args.data_root else _world(cfg) / "data"
    run_id = None
    if args.log_to_run:
        run_id_file = Path(args.log_to_run) / "mlflow_run_id"
        if not run_id_file.is_file():
            raise DataError("no MLflow run id beside this RL run (was it trained with mlflow.enabled?)", run_id_file)
        run_id = run_id_file.read_text().strip()
    report = evaluate(
        args.checkpoint,
        args.dataset,
        experts,
        data_root,
        args.out,
        base_model=args.base_model,
        prompts=_prompts(cfg),
        backend=args.backend or cfg["eval"]["backend"],
        batch_size=args.batch_size or cfg["eval"]["batch_size"],
        device="cpu" if cfg["device"] == "cpu" else "cuda",
        dtype=of_config(cfg).dtype,
        limit=args.limit or cfg["eval"]["questions"],
        world="real" if args.real or cfg["world"] == "real" else "toy",
        max_new_tokens=args.max_new_tokens or eval_max_new_tokens(cfg, args.dataset),
        mlflow_run_id=run_id,
    )
    if run_id is not None:
        from .tracking import log_to_run

        block = report["model"]
        # named like the training metrics (reward/expert1): eval/expert1/lenient
        metrics = {
            f"eval/expert{name[1:]}/{m}": e[m]
            for name, e in block["experts"].items()
            for m in ("strict", "lenient", "finished")
        }
        if "majority_vote" in block:
            for mode in ("strict", "lenient"):
                metrics[f"eval/majority_vote/{mode}"] = block["majority_vote"][mode]
        log_to_run(cfg["mlflow"], run_id, metrics, [args.out])
    for which in ("model", "base"):
        block = report.get(which)
        if block is None:
            continue
        for name, e in block["experts"].items():
            print(
                f"{which} {name}: strict {e['strict']:.3f} lenient {e['lenient']:.3f} "
                f"({e['seconds_per_100_questions']} s per 100 questions)"
            )
        if "majority_vote" in block:
            print(f"{which} majority vote: {block['majority_vote']['lenient']:.3f}")


def cmd_complementarity(args: argparse.Namespace) -> None:
    from .complementarity import run
    from .grid import deep_rl
    from .records import check_dataset_name
    from .rollout import Sampling

    cfg = _config(args)
    check_dataset_name(args.dataset, "--dataset")
    experts = [int(k) for k in args.experts.split(",")]
    data_root = Path(args.data_root) if args.data_root else _world(cfg) / "data"
    settings = cfg["analysis"]["complementarity"]
    rl = deep_rl(cfg, args.dataset)  # the data set's rollout settings
    sampling = Sampling(int(rl["max_new_tokens"]), float(rl["temperature"]), float(rl["top_p"]))
    k = args.k or settings["samples"]
    title = args.title or f"{args.dataset}: {k} samples per expert, temperature {sampling.temperature}"
    checkpoints = args.checkpoint.split(",")  # one MEF model, or one single-expert model per expert
    stats = run(
        checkpoints[0] if len(checkpoints) == 1 else checkpoints,
        data_root / args.dataset / f"{args.split or settings['split']}.jsonl",
        experts,
        k,
        sampling,
        args.out,
        title,
        prompts=_prompts(cfg),
        limit=args.limit or settings["questions"],
        seed=cfg["seed"],
        mode=cfg["reward"]["mode"],  # the mode every table scores in
    )
    print(json.dumps({k: v for k, v in stats.items() if k != "patterns"}, indent=1))


def cmd_calibrate(args: argparse.Namespace) -> None:
    from .calibration import calibrate
    from .grid import deep_rl
    from .records import check_dataset_name
    from .rollout import Sampling

    cfg = _config(args)
    check_dataset_name(args.dataset, "--dataset")
    rl = deep_rl(cfg, args.dataset)  # RL's sampling on this data set: what the gate is about
    settings = cfg["calibration"]
    experts = [int(k) for k in args.experts.split(",")]
    headline = cfg["report"]["headline_expert"]
    # the gate guards the MEF (multi-expert) models RL is about; a single-expert baseline's model is
    # measured and reported, never a reason to stop
    gate = settings["gate"] if len(experts) > 1 else "warn"
    result = calibrate(
        args.out,
        gate,
        settings["ranges"],
        args.where,
        model_dir=args.checkpoint,
        data_root=Path(args.data_root) if args.data_root else _world(cfg) / "data",
        dataset=args.dataset,
        experts=experts,
        headline=headline if headline in experts else experts[0],
        sampling=Sampling(int(rl["max_new_tokens"]), float(rl["temperature"]), float(rl["top_p"])),
        train_questions=settings["train_questions"],
        samples=settings["samples"],
        test_questions=settings["test_questions"],
        prompts=_prompts(cfg),
        mode=cfg["reward"]["mode"],
        seed=cfg["seed"],
        precision=of_config(cfg),
    )
    print(json.dumps(result, indent=1))


def cmd_mlflow_init(args: argparse.Namespace) -> None:
    from .tracking import ensure_experiment

    cfg = _config(args)
    settings = _mlflow_settings(cfg)
    experiment_id = ensure_experiment(settings) if settings["enabled"] else None
    atomic_write_json(
        args.out,
        {
            "tracking_uri": settings["tracking_uri"],
            "experiment": settings["experiment"],
            "experiment_id": experiment_id,
        },
    )
    print(f"MLflow experiment {settings['experiment']!r} ({experiment_id}) in {settings['tracking_uri']}")


def cmd_report(args: argparse.Namespace) -> None:
    from .config import PROJECT_ROOT
    from .report import build

    cfg = _config(args)
    layout = Layout.of(cfg, args.results)
    out = Path(args.out) if args.out else report_dir(cfg)
    reference = Path(cfg["report"]["reference"])
    if not reference.is_absolute() and not reference.is_file():
        reference = PROJECT_ROOT / reference
    written = build(cfg, layout.root, out, reference)
    if cfg["mlflow"]["enabled"]:
        from .tracking import Tracker

        # the tables and figures as artifacts of one run per profile, found again by its key
        tracker = Tracker(
            layout.report_run,
            f"{cfg['profile']}/report",
            {"grid": cfg["grid"], "report": cfg["report"]},
            _mlflow_settings(cfg),
        )
        for path in written:
            tracker.log_artifact(path)
        tracker.close()
    print(f"{len(written)} files -> {out}")


def cmd_worker(args: argparse.Namespace) -> None:
    from .worker import serve

    serve(args.socket)


def cmd_standin_byo(args: argparse.Namespace) -> None:
    from .standin import write_byo_file

    n = write_byo_file(args.data, args.dataset, args.expert, args.out)
    print(f"{args.dataset}: {n} bring-your-own trajectories of expert {args.expert} -> {args.out}")


def cmd_gold_expert(args: argparse.Namespace) -> None:
    from .experts import gold_expert

    n = gold_expert(args.data, args.dataset, args.out)
    print(f"{args.dataset}: {n} gold-rationale trajectories (expert 0) -> {args.out}")


def cmd_teach(args: argparse.Namespace) -> None:
    from .teachers import build_expert, settings_for

    cfg = _config(args)
    settings = settings_for(cfg, args.expert)
    root = Layout.of(cfg, args.results).world("real")  # teachers serve the real world only
    with contextlib.ExitStack() as stack:
        teacher = None
        if settings.get("standin"):  # a local stand-in on 127.0.0.1 (config/real-smoke.yaml)
            from .records import read_records
            from .standin import StandinServer
            from .teachers import OpenAITeacher

            server = StandinServer(read_records(root / "data" / args.dataset / "train.jsonl", args.dataset))
            teacher = OpenAITeacher({**settings, "base_url": stack.enter_context(server)})
        summary = build_expert(
            root / "data" / args.dataset,
            args.dataset,
            args.expert,
            settings,
            root / "experts" / args.dataset,
            root / "teacher_cache",
            _prompts(cfg),
            teacher=teacher,
        )
        if teacher is not None:  # what the server answered, beside the stats it should match
            atomic_write_json(root / "experts" / args.dataset / f"e{args.expert}.standin.json", server.answered)
    if cfg["mlflow"]["enabled"]:
        from .tracking import Tracker

        # one run per data set and teacher; the key's NAME may appear, the key never does
        substitute = settings["backend"] == "vllm"
        tracker = Tracker(
            root / "teacher_runs" / args.dataset / f"e{args.expert}",
            f"{cfg['profile']}/teacher/{args.dataset}/e{args.expert}",
            {"teacher": settings, "dataset": args.dataset, "expert": args.expert},
            _mlflow_settings(cfg),
            tags={
                "teacher_backend": settings["backend"],
                "teacher_model": str(settings.get("model") or ""),
                **({"deviation": "substitute teacher model (local vLLM), not the paper's"} if substitute else {}),
            },
        )
        tracker.log(0, {k: float(v) for k, v in summary.items() if isinstance(v, (int, float)) and v is not None})
        tracker.close()
    failed = summary.get("questions_failed", 0)
    print(
        f"{args.dataset} expert {args.expert}: {summary['questions_with_trajectory']} of {summary['questions']} "
        f"questions have an accepted trajectory (acceptance {summary['acceptance_rate']}); "
        f"{failed} failed on every retry this time (the next run asks for them again)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="meml", description="MEML-GRPO reproduction harness")
    sub = parser.add_subparsers(dest="command", required=True)

    def with_config(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", default=None, help="YAML config (default: config/default.yaml)")
        p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key, e.g. seed=1")
        p.add_argument("--config-json", default=None, help="top-level config sections as one JSON mapping")

    p = sub.add_parser("cost", help="estimate the GPU-hours of every cell (measured or assumed throughput)")
    with_config(p)
    p.add_argument("--measure", action="store_true", help="time a few RL steps here first (saved for later runs)")
    p.add_argument("--steps", type=int, default=3, help="RL steps timed per model (the first is warm-up)")
    p.add_argument("--results", help="results folder (default results/<profile>); the throughputs are kept there")
    p.add_argument("--out", help="also write the table to this Markdown file")
    p.set_defaults(func=cmd_cost)

    p = sub.add_parser("toy-world", help="build the toy data sets and expert trajectories")
    with_config(p)
    p.add_argument("--out", required=True, help="output folder (data/, experts/, raw/ go inside)")
    p.set_defaults(func=cmd_toy_world)

    p = sub.add_parser("toy-stats", help="print the toy world's statistics")
    p.add_argument("--root", required=True, help="folder that toy-world wrote")
    p.add_argument("--out", default=None, help="also write <out>.json and <out>.md")
    p.set_defaults(func=cmd_toy_stats)

    p = sub.add_parser("tiny-models", help="train the tokenizer and save the tiny Qwen2 and Llama models")
    with_config(p)
    p.add_argument("--root", required=True, help="toy world folder (its texts train the tokenizer)")
    p.add_argument("--out", required=True, help="models folder; qwen2/ and llama/ go inside")
    p.set_defaults(func=cmd_tiny_models)

    p = sub.add_parser("prepare", help="load a real data set into prepared JSONL")
    with_config(p)
    p.add_argument("--dataset", required=True, help="gsm8k, strategyqa or mathqa")
    p.add_argument("--local", default=None, help="folder of the original files (overrides the config)")
    p.add_argument("--out", required=True, help="output folder; <dataset>/{train,test}.jsonl go inside")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("agreement", help="answer checker against the real gold rationales")
    p.add_argument("--datasets", default="../shared/datasets", help="folder with gsm8k/, strategyqa/, mathqa/")
    p.add_argument("--out", default="results/agreement", help="where agreement.{json,md} and the mismatches go")
    p.set_defaults(func=cmd_agreement)

    def with_cell(p: argparse.ArgumentParser) -> None:
        p.add_argument("--model", default="qwen2", help="model name: a folder under results/<profile>/models/")
        p.add_argument("--dataset", required=True, help="gsm8k, strategyqa or mathqa")
        p.add_argument("--results", default=None, help="results root (default results/<profile>)")
        p.add_argument("--out", default=None, help="run folder (default: named by the run's values)")

    p = sub.add_parser("sft", help="multi-expert SFT (MEF)")
    with_config(p)
    with_cell(p)
    p.add_argument("--experts", default=None, help="comma-separated expert ids, e.g. 0,1,2")
    p.add_argument("--method", default="MEML-GRPO", help="take the experts from this method's sft_experts")
    p.add_argument("--model-dir", default=None, help="base model folder (default: the tiny model)")
    p.set_defaults(func=cmd_sft)

    p = sub.add_parser("rl", help="one RL cell (GRPO, Dr.GRPO, MEML-GRPO or any configured method)")
    with_config(p)
    with_cell(p)
    p.add_argument("--method", required=True, help="a method named in the config's `methods`")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sft-dir", default=None, help="the SFT model to start from (default: the method's SFT run)")
    p.set_defaults(func=cmd_rl)

    p = sub.add_parser("eval", help="accuracy per expert prompt through lm-eval, and the majority vote")
    with_config(p)
    p.add_argument("--checkpoint", required=True, help="model folder to evaluate")
    p.add_argument("--dataset", required=True, help="gsm8k, strategyqa or mathqa")
    p.add_argument("--experts", default="0,1,2", help="comma-separated expert ids")
    p.add_argument("--data-root", default=None, help="prepared data folder (default results/<profile>/toy/data)")
    p.add_argument("--real", action="store_true", help="name the lm-eval tasks as the real data sets'")
    p.add_argument("--base-model", default=None, help="also evaluate this untrained base model the same way")
    p.add_argument("--backend", default=None, choices=["hf", "vllm"], help="default: eval.backend")
    p.add_argument("--batch-size", type=int, default=None, help="default: eval.batch_size")
    p.add_argument("--limit", type=int, default=None, help="only the first N test questions")
    p.add_argument("--max-new-tokens", type=int, default=None, help="override the tasks' generation limit")
    p.add_argument("--log-to-run", default=None, help="RL run folder whose MLflow run gets the results")
    p.add_argument("--out", required=True, help="JSON report")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("complementarity", help="expert complementarity: error overlap of k samples per expert")
    with_config(p)
    p.add_argument("--checkpoint", required=True, help="the MEF model")
    p.add_argument("--dataset", required=True)
    p.add_argument("--split", default=None, choices=["train", "test"], help="default: analysis.complementarity.split")
    p.add_argument("--experts", default="0,1,2")
    p.add_argument(
        "--k", type=int, default=None, help="samples per expert and question (analysis.complementarity.samples)"
    )
    p.add_argument("--data-root", default=None)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--title", default=None)
    p.add_argument("--out", required=True, help="output stem: <out>.json, <out>.png, <out>.pdf")
    p.set_defaults(func=cmd_complementarity)

    p = sub.add_parser("calibrate", help="the calibration gate: is an MEF model in the informative range?")
    with_config(p)
    p.add_argument("--checkpoint", required=True, help="the MEF model")
    p.add_argument("--dataset", required=True)
    p.add_argument("--experts", required=True, help="the experts it was trained on, e.g. 0,1,2")
    p.add_argument("--data-root", default=None)
    p.add_argument("--where", default="this model", help="how the gate's message names the model")
    p.add_argument("--out", required=True, help="the calibration JSON")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("mlflow-init", help="create the MLflow store and the profile's experiment, once")
    with_config(p)
    p.add_argument("--out", required=True, help="marker JSON with the experiment's id")
    p.set_defaults(func=cmd_mlflow_init)

    p = sub.add_parser("report", help="every table (Markdown, LaTeX) and figure, from the result files")
    with_config(p)
    p.add_argument("--results", default=None, help="results root (default results/<profile>)")
    p.add_argument("--out", default=None, help="report folder (default report/<profile>)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("worker", help="a warm process that runs the DAG's jobs as forked children (worker.py)")
    p.add_argument("--socket", required=True, help="the Unix socket to listen on")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("standin-byo", help="real-smoke: a bring-your-own trajectory file from the gold rationales")
    p.add_argument("--dataset", required=True)
    p.add_argument("--expert", type=int, required=True)
    p.add_argument("--data", required=True, help="the prepared data set's folder (train.jsonl)")
    p.add_argument("--out", required=True, help="folder; <dataset>/e<k>.jsonl goes inside")
    p.set_defaults(func=cmd_standin_byo)

    p = sub.add_parser("gold-expert", help="real world: expert 0's trajectories from the gold rationales")
    p.add_argument("--dataset", required=True)
    p.add_argument("--data", required=True, help="prepared data folder of this data set (train.jsonl)")
    p.add_argument("--out", required=True, help="folder for e0.jsonl")
    p.set_defaults(func=cmd_gold_expert)

    p = sub.add_parser("teach", help="real world: expert k's trajectories from its teacher (teachers.e<k>)")
    with_config(p)
    p.add_argument("--dataset", required=True)
    p.add_argument("--expert", type=int, required=True)
    p.add_argument("--results", default=None, help="results root (default results/<profile>)")
    p.set_defaults(func=cmd_teach)

    args = parser.parse_args(argv)
    try:
        args.func(args)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
