"""Which RL settings make GRPO teach? A sweep on one toy world's SFT models, measured where it counts.

Every setting trains the method's SFT model of each (data set, world seed) with RL, once per RL seed,
and is measured by what it did to held-out accuracy: the RL model's greedy answers on the world's
test questions against its SFT start's, paired by question (the SFT start is evaluated once). Beside
it, what a run's curves say: the training reward's change (last steps minus first, Welch's interval),
entropy, completion length, the share cut at the cap, the share of zero-advantage subgroups (every
rollout scored alike: GRPO's sparsity), and how far one step moves the weights
(update/relative_change, ||delta theta|| / ||theta||). The SFT start's pass@1 against its pass@k (k =
the group size) on the same questions is the headroom RL can turn into pass@1.

A sweep file names the settings, each laid over the config (a method's name, `rl` keys, and
`shuffle: true` for the shuffled-advantage control of the same setting):

    method: Expert1-SFT-GRPO          # the default method of every setting
    settings:
      study: {}                       # the config as it is
      lr2e-5: {rl: {lr: 2.0e-5}}
      lr2e-5-shuffled: {rl: {lr: 2.0e-5}, shuffle: true}

    .venv/bin/python scripts/rl_sweep.py --config config/toy-study.yaml \\
        --results results/<profile> --sweep scripts/rl-sweep.yaml --datasets gsm8k strategyqa --seeds 0 1 2 \\
        --out report/example/rl-sweep

writes <out>/runs/ (each run's folder, kept: a rerun skips a finished run), <out>/sft/ (each SFT
start's held-out answers), and <out>/sweep.json and <out>/sweep.md (one row a setting and data set).
The world seeds' SFT models must exist (run the config's workflow up to them first); RL seeds, given
with --rl-seeds, retrain RL alone from the same SFT model.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from meml.core.config import deep_merge, load_config, method_rl
from meml.core.io import atomic_write_json, atomic_write_text, read_json, read_jsonl
from meml.core.records import read_records
from meml.data.experts import prompts_of
from meml.evaluation.calibration import pass_at, sample_correct
from meml.plan.grid import data_folder, sft_run
from meml.plan.layout import Layout
from meml.reporting import stats
from meml.reporting.rl_stage import edge_change
from meml.training.rl import Method, RLArgs, RLPaths, RLSettings, run_rl
from meml.training.rollout import Sampling

LEVEL = 0.95


def answers(
    model_dir: Path, records: list[Any], expert: int, sampling: Sampling, n: int, cfg: dict[str, Any]
) -> list[list[Any]]:
    """Each record's n answers (correct, finished, tokens) from the model under the expert's prompt."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from meml.training.engines import sampling_engine

    torch.manual_seed(cfg["seed"])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    engine = sampling_engine(model, tokenizer)
    found = sample_correct(engine, tokenizer, records, [expert], n, sampling, prompts_of(cfg), cfg["reward"]["mode"])
    return found[expert]


def sft_start(
    cfg: dict[str, Any], start: Path, test: list[Any], expert: int, rl: dict[str, Any], out: Path
) -> dict[str, Any]:
    """The SFT start's greedy answers and its pass@1 / pass@k at RL's sampling (cached in `out`)."""
    if out.is_file():
        return read_json(out)
    s = RLSettings.from_config(rl)
    greedy = answers(start, test, expert, Sampling(s.max_new_tokens, greedy=True), 1, cfg)
    sampled = answers(start, test, expert, s.sampling, s.group_size, cfg)
    result = {"model": str(start), "correct": [int(a[0][0]) for a in greedy], **pass_at(sampled)}
    atomic_write_json(out, result)
    return result


def train(cfg: dict[str, Any], method: Method, rl: dict[str, Any], start: Path, data: Path, experts: Path,
          out: Path, seed: int) -> None:  # fmt: skip
    """One RL run, no MLflow (a finished run is kept and not trained again)."""
    args = RLArgs(RLSettings.from_config(rl), method, seed, prompts_of(cfg), params={"rl": rl, "method": method.name})
    run_rl(args, RLPaths(start, data, experts, out), progress=sys.stderr.isatty())


def curves(out: Path) -> dict[str, Any]:
    """What the run's metrics say: reward change, and the last tenth's entropy, length, cut share,
    zero-advantage share; the mean relative weight change per step."""
    rows = [row for _, row in read_jsonl(out / "metrics.jsonl")]
    tail = rows[-max(1, len(rows) // 10) :]

    def mean(key: str, among: list[dict[str, Any]] = tail) -> float:
        return statistics.fmean(r.get(key, math.nan) for r in among)

    zero = [r for r in tail if "subgroups/all_wrong" in r]
    change = edge_change([r["reward/mean"] for r in rows])
    low, high = change.interval(LEVEL)
    return {
        "steps": len(rows),
        "reward_first": round(100 * statistics.fmean(r["reward/mean"] for r in rows[: max(1, len(rows) // 10)]), 1),
        "reward_last": round(100 * mean("reward/mean"), 1),
        "reward_change": [round(change.mean, 1), round(low, 1), round(high, 1)],
        "entropy": round(mean("entropy"), 3),
        "length": round(mean("completion/length_mean"), 1),
        "truncated": round(100 * (1 - mean("completion/finished_fraction")), 1),
        "zero_advantage": round(100 * statistics.fmean(_zero_share(r) for r in zero), 1) if zero else None,
        "relative_change": mean("update/relative_change", rows),
        "seconds_per_step": round(mean("perf/step_seconds", rows), 2),
    }


def _zero_share(row: dict[str, Any]) -> float:
    """The share of subgroups whose rollouts all scored alike (all wrong or all right): no advantage."""
    wrong = [v for k, v in row.items() if k.startswith("subgroups/all_wrong/")]
    right = [v for k, v in row.items() if k.startswith("subgroups/all_correct/")]
    return statistics.fmean(w + r for w, r in zip(wrong, right, strict=True))


def estimate(diffs: list[list[np.ndarray]]) -> stats.Estimate:
    """The held-out change in points: diffs[world seed][rl seed] is a questions vector of RL minus
    SFT. One world seed: seeds x questions crossed (the RL seeds share the questions); several: the
    t-interval over the world seeds' means (each world has its own questions)."""
    if len(diffs) == 1:
        return stats.cell_estimate(100 * np.array(diffs[0]))
    per_world = [np.mean(np.array(d), axis=0) for d in diffs]
    return stats.cell_estimate(100 * np.array([[float(w.mean())] for w in per_world]), nested=False)


def collect(parts: list[str], out: Path) -> int:
    """One table from several sweeps' folders, each given as LABEL=FOLDER: its rows, labelled (the
    world or code they ran on), with each sweep's command kept."""
    rows: list[dict[str, Any]] = []
    commands: dict[str, list[str]] = {}
    for part in parts:
        label, _, folder = part.partition("=")
        found = read_json(Path(folder) / "sweep.json")
        commands.setdefault(label, []).append(found["command"])
        rows += [{**row, "world": label} for row in found["rows"]]
    # a setting run again with more RL seeds (its first run among them) replaces its earlier row
    most: dict[tuple[str, str, str], dict[str, Any]] = {}
    for row in rows:
        key = (row["world"], row["setting"], row["dataset"])
        if key not in most or len(row["runs"]) > len(most[key]["runs"]):
            most[key] = row
    rows = [row for row in rows if most[(row["world"], row["setting"], row["dataset"])] is row]
    atomic_write_json(out / "sweep.json", {"level": LEVEL, "commands": commands, "rows": rows})
    atomic_write_text(out / "sweep.md", render(rows) + "\n")
    print(render(rows))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--collect", nargs="+", default=None, help="LABEL=FOLDER ...: merge finished sweeps into --out")
    parser.add_argument("--config", nargs="+", help="config files laid over config/default.yaml")
    parser.add_argument("--results", help="the results folder holding the SFT models and the world")
    parser.add_argument("--sweep", help="the sweep file (see the docstring)")
    parser.add_argument("--datasets", nargs="+", default=["gsm8k", "strategyqa"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0], help="world seeds (each its own SFT model)")
    parser.add_argument("--rl-seeds", nargs="+", type=int, default=[0], help="RL seeds on each world seed")
    parser.add_argument("--only", nargs="*", default=None, help="run only these settings")
    parser.add_argument("--model", default="qwen2")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.collect:
        return collect(args.collect, Path(args.out))
    if not (args.config and args.results and args.sweep):
        parser.error("--config, --results and --sweep are needed (or --collect)")

    import torch

    cfg = load_config(args.config[0])
    for more in args.config[1:]:  # laid over in order, as Snakemake lays several --configfile
        cfg = deep_merge(cfg, yaml.safe_load(Path(more).read_text(encoding="utf-8")) or {})
    torch.set_num_threads(int(cfg["threads"]))
    sweep = yaml.safe_load(Path(args.sweep).read_text(encoding="utf-8"))
    layout, out = Layout.of(cfg, args.results), Path(args.out)
    expert = cfg["report"]["headline_expert"]
    rows = []
    for name, setting in sweep["settings"].items():
        if args.only and name not in args.only:
            continue
        setting = setting or {}
        method_name = setting.get("method", sweep.get("method", "Expert1-SFT-GRPO"))
        switches = {**cfg["methods"][method_name], "shuffle_advantages": bool(setting.get("shuffle"))}
        method = Method.from_config(method_name, switches)
        for ds in args.datasets:
            rl = deep_merge(method_rl(cfg, method_name, ds), setting.get("rl") or {})
            diffs, sft_rows, runs = [], [], []
            for seed in args.seeds:
                folder = data_folder(cfg, seed)
                start = layout.sft(args.model, ds, sft_run(cfg, list(method.sft_experts), seed)) / "model"
                data, experts = layout.data(cfg["world"], ds, folder), layout.experts(cfg["world"], ds, folder)
                test = read_records(data / "test.jsonl")
                sampled_as = f"T{rl['temperature']}-G{rl['group_size']}-cap{rl['max_new_tokens']}"
                cached = (
                    out
                    / "sft"
                    / ds
                    / f"seed{seed}-{sft_run(cfg, list(method.sft_experts), seed).split('/')[0]}-{sampled_as}.json"
                )
                base = sft_start(cfg, start, test, expert, rl, cached)
                sft_rows.append(base)
                world = []
                for rl_seed in args.rl_seeds:
                    run = out / "runs" / name / ds / f"seed{seed}-rl{rl_seed}"
                    t0 = time.time()
                    train(cfg, method, rl, start, data, experts, run, rl_seed)
                    done = run / "heldout.json"
                    if not done.is_file():
                        greedy = answers(
                            run / "model", test, expert, Sampling(rl["max_new_tokens"], greedy=True), 1, cfg
                        )
                        atomic_write_json(done, {"correct": [int(a[0][0]) for a in greedy]})
                    correct = np.array(read_json(done)["correct"], dtype=float)
                    world.append(correct - np.array(base["correct"], dtype=float))
                    sft_accuracy = 100 * np.mean(base["correct"])
                    # the change over this run's own SFT start (each world seed has its own)
                    change = round(100 * correct.mean() - sft_accuracy, 1)
                    runs.append({"seed": seed, "rl_seed": rl_seed, "accuracy": round(100 * correct.mean(), 1),
                                 "change": change, **curves(run)})  # fmt: skip
                    print(f"[sweep] {name} {ds} seed{seed} rl{rl_seed}: held-out {100 * correct.mean():.1f} "
                          f"(SFT {sft_accuracy:.1f}) in {time.time() - t0:.0f} s", file=sys.stderr)  # fmt: skip
                diffs.append(world)
            est = estimate(diffs)
            low, high = est.interval(LEVEL) if est.has_interval else (math.nan, math.nan)
            rows.append({
                "setting": name, "dataset": ds, "method": method_name, "shuffled": bool(setting.get("shuffle")),
                "rl": setting.get("rl") or {},
                "sft_accuracy": round(100 * statistics.fmean(float(np.mean(b["correct"])) for b in sft_rows), 1),
                "sft_pass_at_1": round(100 * statistics.fmean(b["pass_at_1"] for b in sft_rows), 1),
                "sft_pass_at_k": round(100 * statistics.fmean(b["pass_at_k"] for b in sft_rows), 1),
                "heldout_change": [round(est.mean, 1), round(low, 1), round(high, 1)],
                "runs": runs,
            })  # fmt: skip
    atomic_write_json(out / "sweep.json", {"command": " ".join(sys.argv), "level": LEVEL, "rows": rows})
    atomic_write_text(out / "sweep.md", render(rows) + "\n")
    print(render(rows))
    return 0


def render(rows: list[dict[str, Any]]) -> str:
    def avg(row: dict[str, Any], key: str) -> float | None:
        values = [r[key] for r in row["runs"] if r.get(key) is not None]
        return statistics.fmean(values) if values else None

    def num(value: float | None, digits: int = 1) -> str:
        return "–" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"

    labelled = any("world" in row for row in rows)
    lines = [
        ("| world " if labelled else "")
        + "| setting | data set | SFT greedy | SFT pass@1 / pass@k | held-out change over SFT [95% CI] | "
        "training reward first → last | entropy | length | cut % | zero-adv % | rel. change / step | s / step |",
        ("| --- " if labelled else "")
        + "| --- | --- | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        d, low, high = row["heldout_change"]
        change = f"{d:+.1f} [{low:+.1f}, {high:+.1f}]" if math.isfinite(low) else f"{d:+.1f}"
        if len(row["runs"]) > 1:  # several RL seeds: each run's own change too
            # rows of one world seed written before runs kept their own change: the row's SFT is theirs
            own = [r.get("change", r["accuracy"] - row["sft_accuracy"]) for r in row["runs"]]
            change += " (runs: " + ", ".join(f"{c:+.1f}" for c in own) + ")"
        first, last = avg(row, "reward_first"), avg(row, "reward_last")
        rel = avg(row, "relative_change")
        lines.append(
            (f"| {row.get('world', '')} " if labelled else "")
            + f"| {row['setting']} | {row['dataset']} | {row['sft_accuracy']:.1f} | "
            f"{row['sft_pass_at_1']:.1f} / {row['sft_pass_at_k']:.1f} | {change} | {num(first)} → {num(last)} | "
            f"{num(avg(row, 'entropy'), 3)} | {num(avg(row, 'length'))} | {num(avg(row, 'truncated'))} | "
            f"{num(avg(row, 'zero_advantage'))} | {'–' if rel is None else f'{rel:.1e}'} | "
            f"{num(avg(row, 'seconds_per_step'), 2)} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
