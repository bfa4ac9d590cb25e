"""Evidence on the toy world: reward sparsity after MEF, and GRPO against MEML-GRPO reward curves.

    .venv/bin/python scripts/toy_evidence.py --sft results/toy/sft/qwen2/gsm8k/e0-e1-e2/model \
        --world results/toy/toy --dataset gsm8k --steps 60 --out results/toy/evidence

1. Sparsity at the start of RL: the MEF model samples G = 8 rollouts per expert (temperature from
   the config) on the first `--questions` training questions; per expert, the share of questions on which
   all of its rollouts fail, for the `split` spread (3/3/2) and for 8 rollouts each; and the share
   that no expert solves.
2. Two RL runs from the same MEF model, seed and rollout budget (three experts, 3/3/2):
   MoE-SFT-GRPO (plain GRPO) and MEML-GRPO (IML and HSFT on). Their reward curves go to a PNG/PDF
   figure (raw per step and a moving average) and the numbers to evidence.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch


def sparsity_at_start(sft: Path, data: Path, n_questions: int, settings: dict[str, Any], seed: int) -> dict[str, Any]:
    from meml.core.config import rollouts_per_expert
    from meml.evaluation.complementarity import sample_correctness
    from meml.training.rollout import Sampling

    sampling = Sampling(int(settings["max_new_tokens"]), float(settings["temperature"]), float(settings["top_p"]))
    G = int(settings["group_size"])
    correct = sample_correctness(
        sft,
        data / "train.jsonl",
        [0, 1, 2],
        G,
        sampling,
        limit=n_questions,
        seed=seed,
        batch_size=int(settings["rollout_batch_size"]),
    )  # (Q, 3, G)
    split = rollouts_per_expert(G, 3, "split")
    out: dict[str, Any] = {"questions": int(correct.shape[0]), "group_size": G, "temperature": sampling.temperature}
    for k in range(3):
        out[f"expert{k}"] = {
            "accuracy": round(float(correct[:, k].float().mean()), 3),
            "all_wrong_split": round(float((~correct[:, k, : split[k]].any(-1)).float().mean()), 3),
            "all_wrong_8": round(float((~correct[:, k].any(-1)).float().mean()), 3),
        }
    split_any = torch.stack([correct[:, k, : split[k]].any(-1) for k in range(3)], -1).any(-1)
    out["no_expert_solves_split"] = round(float((~split_any).float().mean()), 3)
    out["no_expert_solves_8_each"] = round(float((~correct.any(-1).any(-1)).float().mean()), 3)
    return out


def moving_average(values: list[float], window: int) -> list[float]:
    return [
        sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1])
        for i in range(len(values))
    ]


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from meml.core.config import load_config
    from meml.training.rl import Method, RLArgs, RLPaths, RLSettings, run_rl

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sft", type=Path, required=True)
    parser.add_argument("--world", type=Path, required=True)
    parser.add_argument("--dataset", default="gsm8k")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    cfg = load_config()
    # the RL settings of the published measurement (the grid's toy defaults are smaller, for time)
    settings = dict(cfg["rl"], steps=args.steps, questions_per_step=8, max_new_tokens=320, checkpoint_every=10)
    settings["buffer"] = dict(settings["buffer"], capacity=64)
    data, experts = args.world / "data" / args.dataset, args.world / "experts" / args.dataset
    evidence: dict[str, Any] = {
        "sparsity_at_start": sparsity_at_start(args.sft, data, args.questions, settings, args.seed)
    }
    print(json.dumps(evidence["sparsity_at_start"], indent=2))
    curves = {}
    for name in ("MoE-SFT-GRPO", "MEML-GRPO"):
        out = args.out / name
        method = Method.from_config(name, cfg["methods"][name])
        run_rl(RLArgs(RLSettings.from_config(settings), method, args.seed), RLPaths(args.sft, data, experts, out))
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        curves[name] = [r["reward/mean"] for r in rows]
        w = args.window
        evidence[name] = {
            "reward_first_window": round(sum(curves[name][:w]) / w, 4),
            "reward_last_window": round(sum(curves[name][-w:]) / w, 4),
            "all_wrong_first_window": round(sum(r["subgroups/all_wrong"] for r in rows[:w]) / w, 4),
            "all_wrong_last_window": round(sum(r["subgroups/all_wrong"] for r in rows[-w:]) / w, 4),
            "iml_pairs_total": sum(r["iml/pairs"] for r in rows),
            "hsft_flushes": rows[-1]["hsft/flushes"],
        }
        print(name, json.dumps(evidence[name]))
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for name, color in (("MoE-SFT-GRPO", "tab:blue"), ("MEML-GRPO", "tab:red")):
        ax.plot(curves[name], color=color, alpha=0.25, linewidth=1)
        ax.plot(
            moving_average(curves[name], args.window),
            color=color,
            linewidth=2,
            label=f"{name} ({args.window}-step average)",
        )
    ax.set_xlabel("RL step")
    ax.set_ylabel("training reward (mean over rollouts)")
    ax.set_title(f"Toy {args.dataset}, tiny Qwen2 stand-in after MEF: same seed, G = 8 (3/3/2)")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    args.out.mkdir(parents=True, exist_ok=True)
    for ext in ("png", "pdf"):
        fig.savefig(args.out / f"reward_curves_{args.dataset}.{ext}", dpi=150)
    (args.out / "evidence.json").write_text(json.dumps(evidence, indent=2) + "\n")


if __name__ == "__main__":
    main()
