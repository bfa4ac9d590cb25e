"""Command-line entry points: what the Snakemake rules call, and what a person runs by hand
(`meml <command> --help` for the options). Each command is a few lines: the config read, one call
into its stage's `jobs` module, a line printed.

meml toy-world        build the toy data sets and expert trajectories
meml toy-stats        print the toy world's statistics
meml tiny-models      train the tokenizer and save the tiny models
meml gguf-model       a model folder from a GGUF file (a package's or a local one), checked by SHA-256
meml hub-model        a hub model at its pinned commit, downloaded into a model folder
meml pin              the hub's current commits of the grid's unpinned models and data sets, to paste
meml prepare          load a real data set (hub id or local folder) into prepared JSONL
meml gold-expert      real world: expert 0's trajectories from the gold rationales
meml teach            real world: expert k's trajectories from its teacher
meml check-lengths    real world: the trajectories' lengths against RL's cap, before SFT
meml carry            the teacher stage's results to a GPU node (rsync)
meml standin-byo      real-smoke: a bring-your-own trajectory file from the gold rationales
meml agreement        check the answer checker against real gold rationales
meml sft              multi-expert SFT (MEF)
meml calibrate        the calibration gate on an SFT model
meml rl               one RL cell
meml eval             accuracy per expert prompt through lm-eval, and the majority vote
meml complementarity  the error overlap of the experts' samples
meml mlflow-init      create the MLflow store and the profile's experiment, once
meml report           every table and figure from the result files
meml cost             estimate the GPU-hours of the grid (`--measure` times a few RL steps here first)

The warm worker that runs the DAG's jobs is `python -m meml.worker` (worker.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from meml.core.io import DataError, atomic_write_json, atomic_write_text
from meml.plan.layout import AGREEMENT, Layout


def _overrides(pairs: list[str]) -> dict[str, Any]:
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise DataError(f"override must look like key.sub=value, got {pair!r}")
        key, value = pair.split("=", 1)
        out[key] = yaml.safe_load(value)
    return out


def _config(args: argparse.Namespace) -> dict[str, Any]:
    from meml.core.config import load_config

    overrides = _overrides(args.set or [])
    if getattr(args, "config_json", None):
        # the Snakemake rules pass the config sections a job reads as one JSON mapping
        sections = json.loads(args.config_json)
        if not isinstance(sections, dict):
            raise DataError("--config-json must be a JSON mapping of top-level config keys")
        overrides = {**sections, **overrides}
    return load_config(args.config, overrides, _overrides(getattr(args, "run", None) or []))


def _ids(text: str) -> list[int]:
    return [int(k) for k in text.split(",")]


def cmd_toy_world(args: argparse.Namespace) -> None:
    from meml.jobs import data as jobs

    for summary in jobs.toy_world(_config(args), args.out, args.seed):
        print(f"{summary['dataset']}: {summary['train']} train / {summary['test']} test -> {args.out}")


def cmd_toy_stats(args: argparse.Namespace) -> None:
    from meml.data.toy.stats import format_stats, world_stats

    stats = world_stats(args.root)
    text = format_stats(stats)
    print(text)
    if args.out:
        atomic_write_json(Path(args.out).with_suffix(".json"), stats)
        atomic_write_text(Path(args.out).with_suffix(".md"), text + "\n")


def cmd_tiny_models(args: argparse.Namespace) -> None:
    from meml.jobs import data as jobs
    from meml.plan.grid import stage_seed, varies

    cfg = _config(args)
    if args.seed is not None and not varies(cfg, "pretrain"):
        raise DataError("a seed's own base model needs pretrain in grid.seeds_vary", None, None, "grid.seeds_vary")
    for name, folder in jobs.tiny_models(cfg, args.root, args.out, stage_seed(cfg, args.seed)).items():
        print(f"{name}: {folder}")


def cmd_gguf_model(args: argparse.Namespace) -> None:
    from meml.data import gguf_models

    entry = json.loads(args.entry)
    if not isinstance(entry, dict) or "source" not in entry:
        raise DataError('--entry must be a model entry as JSON: {"source": ..., "sha256": ...}')
    folder = gguf_models.convert(gguf_models.parse(entry, args.key), args.out)
    print(f"{entry['source']}: {folder}")


def cmd_hub_model(args: argparse.Namespace) -> None:
    from meml.data import hub_models

    folder = hub_models.download(args.source, args.revision, args.out, args.key)
    print(f"{args.source}@{args.revision}: {folder}")


def cmd_pin(args: argparse.Namespace) -> None:
    from meml.data import hub_models

    lines = hub_models.current_commits(_config(args))
    print("\n".join(lines) if lines else "every hub model and data set of the grid is pinned to a commit")


def cmd_prepare(args: argparse.Namespace) -> None:
    from meml.jobs import data as jobs

    for split, records in jobs.prepare(_config(args), args.dataset, args.out, args.local).items():
        print(f"{args.dataset} {split}: {len(records)} records")


def cmd_gold_expert(args: argparse.Namespace) -> None:
    from meml.data.experts import gold_expert

    n = gold_expert(args.data, args.dataset, args.out)
    print(f"{args.dataset}: {n} gold-rationale trajectories (expert 0) -> {args.out}")


def cmd_teach(args: argparse.Namespace) -> None:
    from meml.jobs import data as jobs

    cfg = _config(args)
    root = Layout.of(cfg, args.results).world("real")  # teachers serve the real world only
    summary = jobs.teach(cfg, args.dataset, args.expert, root)
    print(
        f"{args.dataset} expert {args.expert}: {summary['questions_with_trajectory']} of {summary['questions']} "
        f"questions have an accepted trajectory (acceptance {summary['acceptance_rate']}); "
        f"{summary.get('questions_failed', 0)} failed on every retry this time (the next run asks for them again)"
    )


def cmd_check_lengths(args: argparse.Namespace) -> None:
    from meml.training.lengths import check_before_sft

    sft_done = bool(args.sft) and any(Path(args.sft).rglob("DONE"))
    result = check_before_sft(args.model, args.data, args.experts_dir, json.loads(args.checks), sft_done)
    atomic_write_json(Path(args.out), result)
    for check in result["checks"]:
        shares = ", ".join(f"{k} {v:.1%}" for k, v in check["over_cap"].items())
        print(f"{args.dataset}: over rl.max_new_tokens = {check['max_new_tokens']}: {shares} "
              f"(allowed {check['max_truncated_share']:.0%})")  # fmt: skip
    if "error" in result:
        print(f"warning: SFT has run already; RL will refuse these cells: {result['error']}", file=sys.stderr)


def cmd_carry(args: argparse.Namespace) -> None:
    import subprocess

    from meml.core.config import deep_merge, load_config
    from meml.plan.teacher_stage import carry_command, shell_line

    cfg = load_config(args.configfile[0])
    for path in args.configfile[1:]:  # laid over one another as Snakemake's --configfile does
        cfg = deep_merge(cfg, yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {})
    command = carry_command(cfg, args.to)
    print(shell_line(command))
    if not args.print:
        raise SystemExit(subprocess.run(command).returncode)


def cmd_standin_byo(args: argparse.Namespace) -> None:
    from meml.data.standin import write_byo_file

    n = write_byo_file(args.data, args.dataset, args.expert, args.out)
    print(f"{args.dataset}: {n} bring-your-own trajectories of expert {args.expert} -> {args.out}")


def cmd_agreement(args: argparse.Namespace) -> None:
    from meml.data.agreement import format_report, run

    root = Path(args.datasets)
    if not root.is_dir():
        raise DataError("real data sets folder not found (expected ../shared/datasets beside the project)", root)
    text = format_report(run(root, args.out))
    print(text)
    atomic_write_text(Path(args.out) / "agreement.md", text + "\n")


def cmd_sft(args: argparse.Namespace) -> None:
    from meml.jobs import training as jobs
    from meml.plan.grid import sft_variant

    cfg = _config(args)
    experts = _ids(args.experts) if args.experts else list(jobs.method_of(cfg, args.method).sft_experts)
    summary, out = jobs.sft(
        cfg,
        args.model,
        args.dataset,
        experts,
        results=args.results,
        model_dir=args.model_dir,
        out=args.out,
        seed=args.seed,
    )
    print(f"SFT {sft_variant(experts)} on {args.dataset}: loss {summary['train_loss']} -> {out}")


def cmd_calibrate(args: argparse.Namespace) -> None:
    from meml.jobs import evaluation as jobs

    cfg = _config(args)
    result = jobs.calibrate(
        cfg, args.checkpoint, args.dataset, _ids(args.experts), args.out, args.where, args.data_root
    )
    print(json.dumps(result, indent=1))


def cmd_rl(args: argparse.Namespace) -> None:
    from meml.jobs import training as jobs
    from meml.plan.grid import Cell

    cell = Cell(args.model, args.dataset, args.method, args.seed)
    summary, out = jobs.rl(_config(args), cell, results=args.results, sft_dir=args.sft_dir, out=args.out)
    rewards = f"{summary['reward_first']:.3f} -> {summary['reward_last']:.3f}"
    print(f"RL {args.method} on {args.dataset}: reward {rewards} -> {out}")


def cmd_trl_grpo(args: argparse.Namespace) -> None:
    from meml.jobs import training as jobs
    from meml.plan.grid import Cell

    cell = Cell(args.model, args.dataset, args.method, args.seed)
    summary, out = jobs.trl(_config(args), cell, results=args.results)
    print(f"trl GRPOTrainer {args.method} on {args.dataset}: reward {summary['reward_first']} -> "
          f"{summary['reward_last']} in {summary['seconds']} s -> {out}")  # fmt: skip


def cmd_eval(args: argparse.Namespace) -> None:
    from meml.jobs import evaluation as jobs

    report = jobs.evaluate(
        _config(args),
        args.checkpoint,
        args.dataset,
        _ids(args.experts),
        args.out,
        data_root=args.data_root,
        log_to_run=args.log_to_run,
        base_model=args.base_model,
        backend=args.backend,
        batch_size=args.batch_size,
        limit=args.limit,
        max_new_tokens=args.max_new_tokens,
        real=args.real,
    )
    for which in ("model", "base") if "base" in report else ("model",):
        for name, e in report[which]["experts"].items():
            speed = f"{e['seconds_per_100_questions']} s per 100 questions"
            print(f"{which} {name}: strict {e['strict']:.3f} lenient {e['lenient']:.3f} ({speed})")
        if "majority_vote" in report[which]:
            print(f"{which} majority vote: {report[which]['majority_vote']['lenient']:.3f}")


def cmd_complementarity(args: argparse.Namespace) -> None:
    from meml.jobs import evaluation as jobs

    stats = jobs.complementarity(
        _config(args),
        args.checkpoint.split(","),  # one MEF model, or one single-expert model per expert
        args.dataset,
        _ids(args.experts),
        args.out,
        data_root=args.data_root,
        split=args.split,
        k=args.k,
        limit=args.limit,
        title=args.title,
    )
    print(json.dumps({k: v for k, v in stats.items() if k != "patterns"}, indent=1))


def cmd_mlflow_init(args: argparse.Namespace) -> None:
    from meml.core.tracking import MLflowSettings, ensure_experiment

    settings = MLflowSettings.of(_config(args))
    experiment_id = ensure_experiment(settings) if settings.enabled else None
    marker = {"tracking_uri": settings.tracking_uri, "experiment": settings.experiment, "experiment_id": experiment_id}
    atomic_write_json(args.out, marker)
    print(f"MLflow experiment {settings.experiment!r} ({experiment_id}) in {settings.tracking_uri}")


def cmd_report(args: argparse.Namespace) -> None:
    from meml.reporting.report import write_report

    written, out = write_report(_config(args), args.results, args.out)
    print(f"{len(written)} files -> {out}")


def cmd_cost(args: argparse.Namespace) -> None:
    from meml.plan import cost

    cfg = _config(args)
    measured = Layout.of(cfg, args.results).root / "cost_throughput.json"
    if args.measure:
        import tempfile

        from meml.plan.grid import models
        from meml.training.probe import measure_throughput

        with tempfile.TemporaryDirectory() as work:
            found = measure_throughput(cfg, models(cfg), Path(work), args.steps)
        cost.save_measured(measured, {model: cost.Throughput(**t) for model, t in found.items()})
    text = cost.report(cfg, measured)
    if args.slurm:  # the runtimes to give each rule in a SLURM profile (profiles/slurm holds the paper's)
        minutes = cost.slurm_runtimes(cfg, cost.throughputs(cfg, measured))
        text = "\n".join(
            ["set-resources runtimes (minutes; profiles/slurm):", *(f"  {r}: {m}" for r, m in minutes.items())]
        )
    print(text)
    if args.out:
        atomic_write_text(Path(args.out), text + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="meml", description="MEML-GRPO reproduction harness")
    sub = parser.add_subparsers(dest="command", required=True)

    def with_config(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", default=None, help="YAML config (default: config/default.yaml)")
        p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key, e.g. seed=1")
        p.add_argument("--config-json", default=None, help="top-level config sections as one JSON mapping")
        p.add_argument("--run", action="append", metavar="KEY=VALUE",
                       help="how the job runs (core/config.RUN_KEYS), set where the config has the entry")  # fmt: skip

    p = sub.add_parser("cost", help="estimate the GPU-hours of every cell (measured or assumed throughput)")
    with_config(p)
    p.add_argument("--measure", action="store_true", help="time a few RL steps here first (saved for later runs)")
    p.add_argument("--steps", type=int, default=3, help="RL steps timed per model (the first is warm-up)")
    p.add_argument("--results", help="results folder (default results/<profile>); the throughputs are kept there")
    p.add_argument("--out", help="also write the table to this Markdown file")
    p.add_argument("--slurm", action="store_true", help="print each GPU rule's SLURM runtime instead (2x the estimate)")
    p.set_defaults(func=cmd_cost)

    p = sub.add_parser("toy-world", help="build the toy data sets and expert trajectories")
    with_config(p)
    p.add_argument("--out", required=True, help="output folder (data/, experts/, raw/ go inside)")
    p.add_argument(
        "--seed", type=int, default=None, help="grid seed whose own training data this is (grid.seeds_vary: data)"
    )
    p.set_defaults(func=cmd_toy_world)

    p = sub.add_parser("toy-stats", help="print the toy world's statistics")
    p.add_argument("--root", required=True, help="folder that toy-world wrote")
    p.add_argument("--out", default=None, help="also write <out>.json and <out>.md")
    p.set_defaults(func=cmd_toy_stats)

    p = sub.add_parser("tiny-models", help="train the tokenizer and save the tiny Qwen2 and Llama models")
    with_config(p)
    p.add_argument("--root", required=True, help="toy world folder (its texts train the tokenizer)")
    p.add_argument("--out", required=True, help="models folder; qwen2/ and llama/ go inside")
    p.add_argument(
        "--seed", type=int, default=None, help="grid seed whose own base this is (grid.seeds_vary: pretrain)"
    )
    p.set_defaults(func=cmd_tiny_models)

    p = sub.add_parser("gguf-model", help="a model folder from a GGUF file, checked by SHA-256")
    p.add_argument("--entry", required=True, help='the model entry as JSON: {"source": "gguf:...", "sha256": ...}')
    p.add_argument("--key", default="models", help="the entry's config key, named in errors")
    p.add_argument("--out", required=True, help="the model folder to write")
    p.set_defaults(func=cmd_gguf_model)

    p = sub.add_parser("hub-model", help="a hub model at a pinned commit, downloaded into a model folder")
    p.add_argument("--source", required=True, help="the hub id, owner/name")
    p.add_argument("--revision", required=True, help="the commit (40 hex digits)")
    p.add_argument("--key", default="models", help="the entry's config key, named in errors")
    p.add_argument("--out", required=True, help="the model folder to write")
    p.set_defaults(func=cmd_hub_model)

    p = sub.add_parser("pin", help="print the hub's current commits of the grid's unpinned models and data sets")
    with_config(p)
    p.set_defaults(func=cmd_pin)

    p = sub.add_parser("prepare", help="load a real data set into prepared JSONL")
    with_config(p)
    p.add_argument("--dataset", required=True, help="gsm8k, strategyqa or mathqa")
    p.add_argument("--local", default=None, help="folder of the original files (overrides the config)")
    p.add_argument("--out", required=True, help="output folder; <dataset>/{train,test}.jsonl go inside")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("agreement", help="answer checker against the real gold rationales")
    p.add_argument("--datasets", default="../shared/datasets", help="folder with gsm8k/, strategyqa/, mathqa/")
    p.add_argument("--out", default=str(AGREEMENT), help="where agreement.{json,md} and the mismatches go")
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
    p.add_argument("--seed", type=int, default=None, help="grid seed whose own SFT run this is (grid.seeds_vary: sft)")
    p.set_defaults(func=cmd_sft)

    p = sub.add_parser("rl", help="one RL cell (GRPO, Dr.GRPO, MEML-GRPO or any configured method)")
    with_config(p)
    with_cell(p)
    p.add_argument("--method", required=True, help="a method named in the config's `methods`")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sft-dir", default=None, help="the SFT model to start from (default: the method's SFT run)")
    p.set_defaults(func=cmd_rl)

    p = sub.add_parser("trl-grpo", help="one RL cell trained by trl's GRPOTrainer instead (trl.methods)")
    with_config(p)
    p.add_argument("--model", default="qwen2", help="model name: a folder under results/<profile>/models/")
    p.add_argument("--dataset", required=True, help="gsm8k, strategyqa or mathqa")
    p.add_argument("--results", default=None, help="results root (default results/<profile>)")
    p.add_argument("--method", required=True, help="a one-expert method without IML or HSFT")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_trl_grpo)

    p = sub.add_parser("eval", help="accuracy per expert prompt through lm-eval, and the majority vote")
    with_config(p)
    p.add_argument("--checkpoint", required=True, help="model folder to evaluate")
    p.add_argument("--dataset", required=True, help="gsm8k, strategyqa or mathqa")
    p.add_argument("--experts", default="0,1,2", help="comma-separated expert ids")
    p.add_argument("--data-root", default=None, help="prepared data folder (default results/<profile>/toy/data)")
    p.add_argument("--real", action="store_true", help="name the lm-eval tasks as the real data sets'")
    p.add_argument("--base-model", default=None, help="also evaluate this untrained base model the same way")
    p.add_argument("--backend", default=None, choices=["kv", "hf", "vllm"], help="default: eval.backend")
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

    p = sub.add_parser("check-lengths", help="real world: the trajectories' lengths against RL's cap, before SFT")
    p.add_argument("--model", required=True, help="the base model's folder (its tokenizer) or hub id")
    p.add_argument("--dataset", required=True)
    p.add_argument("--data", required=True, help="prepared data folder of this data set (train.jsonl)")
    p.add_argument("--experts-dir", required=True, help="folder of the experts' e<k>.jsonl")
    p.add_argument("--checks", required=True, help="JSON list of {experts, max_new_tokens, max_truncated_share}")
    p.add_argument("--sft", default=None, help="the SFT runs' folder of this model and data set: one finished there "
                   "makes a cap that does not fit a warning (RL refuses it), not a failure")  # fmt: skip
    p.add_argument("--out", required=True, help="JSON of the shares over the cap")
    p.set_defaults(func=cmd_check_lengths)

    p = sub.add_parser(
        "carry", help="the teacher stage's results to a GPU node (rsync), to run from the project folder"
    )
    p.add_argument("--configfile", nargs="+", required=True, help="the run's config files, as Snakemake takes them")
    p.add_argument("--to", required=True, help="host:folder, the project's folder on the GPU node")
    p.add_argument("--print", action="store_true", help="print the rsync command, run nothing")
    p.set_defaults(func=cmd_carry)

    args = parser.parse_args(argv)
    try:
        args.func(args)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
