"""Step 8 of the RL loop: one step's metrics, over every process's questions.

Names: reward/*, accuracy/mean; subgroups/all_wrong (the share of (question, expert) subgroups
with no correct rollout: where plain GRPO has no gradient) and per expert; iml/pairs; hsft/*
(inserted, buffer fill, flushes, SFT examples); completion/* (length, finished share, truncated
share per expert); dynamic/*; perf/* (seconds; the only values that differ between identical runs).
"""

from __future__ import annotations

import statistics

import torch

from meml.training.distributed import Dist
from meml.training.groups import Sampled
from meml.training.rl_run import Loaded
from meml.training.rl_step import HSFTBatch, IMLBatch, Sequences
from meml.training.rollout import weights_fingerprint


def step_metrics(
    dist: Dist,
    run: Loaded,
    sampled: Sampled,
    seqs: Sequences,
    iml: IMLBatch,
    hsft: HSFTBatch,
    experts: list[int],
    counts: list[int],
    stats: dict[str, float],
    seconds: float,
    rollout_seconds: float,
) -> dict[str, float]:
    """`stats`: this process's losses (averaged over the processes here); `seconds`: the step's."""
    E, groups, buf, policy = len(experts), sampled.groups, run.buf, run.learner.policy
    completions, cells = groups.completions, seqs.cells
    rewards, correct, valid = (torch.cat(dist.gather(t)) for t in (groups.rewards, groups.correct, groups.valid))
    group_sizes = [n for part in dist.gather([sum(map(len, c)) for c in completions]) for n in part]
    tokens = sum(dist.gather(sum(len(completions[q][e][r].token_ids) for q, e, r in cells)))
    finished = sum(dist.gather(sum(completions[q][e][r].finished for q, e, r in cells)))
    per_process = dist.gather(stats)  # losses of each process's share, averaged
    metrics = {"reward/mean": float(rewards[valid].mean()), "accuracy/mean": float(correct[valid].float().mean())}
    for e, k in enumerate(experts):
        sub = correct[:, e, : counts[e]].float().mean(-1)  # (Q,) success rate of each subgroup
        metrics[f"reward/expert{k}"] = float(rewards[:, e, : counts[e]].mean())
        metrics[f"subgroups/all_wrong/expert{k}"] = float((sub == 0).float().mean())
        metrics[f"subgroups/all_correct/expert{k}"] = float((sub == 1).float().mean())
        # the share of the expert's rollouts cut at max_new_tokens (a cut answer scores 0)
        ends = [completions[q][e][r].finished for q, ee, r in cells if ee == e]
        done, total = sum(dist.gather(sum(ends))), sum(dist.gather(len(ends)))
        metrics[f"completion/truncated/expert{k}"] = 1.0 - done / total if total else 0.0
    question_any = correct.any(-1).any(-1)  # (Q,) some expert solved it
    all_wrong = torch.stack([(correct[:, e, : counts[e]].float().mean(-1) == 0) for e in range(E)])
    metrics.update(
        {
            "subgroups/all_wrong": float(all_wrong.float().mean()),
            "questions/none_correct": float((~question_any).float().mean()),
            "rollouts/sampled": float(sampled.rollouts),
            # the rollouts IML and the buffer saw per question: G for every question (one process each)
            "groups/rollouts_min": float(min(group_sizes)),
            "groups/rollouts_max": float(max(group_sizes)),
            "dynamic/replaced": float(sampled.replaced),
            "dynamic/rounds": float(sampled.rounds),
            "iml/pairs": float(sum(dist.gather(len(iml.pairs)))),
            "hsft/inserted": float(hsft.inserted),
            "hsft/buffer_fill": float(len(buf.items)),
            "hsft/flushes": float(buf.flushes),
            "hsft/sft_examples": float(len(hsft.drained)),
            "completion/length_mean": tokens / (len(cells) * dist.world),
            "prompt/length_mean": statistics.fmean(len(p) for p in seqs.prompts),
            "completion/finished_fraction": finished / (len(cells) * dist.world),
            "perf/step_seconds": seconds,
            "perf/rollout_seconds": rollout_seconds,
            "perf/tokens_per_second": tokens / max(rollout_seconds, 1e-9),
            "lr": float(run.learner.scheduler.get_last_lr()[0]),
            **{k: statistics.fmean(p[k] for p in per_process) for k in stats},
        }
    )
    if dist.world > 1:  # the replicas and their buffers must stay identical after every step
        prints = dist.gather(weights_fingerprint(policy.named_parameters(), "float64"))
        # what each buffer holds, and what it gave to SFT this step (a full buffer empties itself)
        buffers = dist.gather([[(h.question_id, h.expert) for h in part] for part in (buf.items, hsft.drained)])
        metrics["dist/processes"] = float(dist.world)
        metrics["dist/replicas_identical"] = float(all(p == prints[0] for p in prints))
        metrics["dist/buffers_identical"] = float(all(b == buffers[0] for b in buffers))
    return metrics
