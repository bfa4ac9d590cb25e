"""The teacher stage of a real run, before the GPUs: the expert trajectories, and the check of their
lengths against RL's cap that the rule trajectory_lengths runs right after them, before SFT."""

from __future__ import annotations

from typing import Any


def checks_before_sft(cfg: dict[str, Any], model: str, dataset: str) -> list[dict[str, Any]]:
    """What RL will check of this model's trajectories on this data set when each of its cells starts
    (training/lengths.py): per (rl.max_new_tokens, rl.max_truncated_share) of the cells' methods on
    the data set, the experts they sample from. The rule trajectory_lengths checks it before SFT."""
    from meml.core.config import method_rl
    from meml.plan import grid

    caps: dict[tuple[int, float], set[int]] = {}
    for cell in grid.cells(cfg):
        if (cell.model, cell.dataset) == (model, dataset):
            rl = method_rl(cfg, cell.method, dataset)
            key = (int(rl["max_new_tokens"]), float(rl["max_truncated_share"]))
            caps.setdefault(key, set()).update(int(k) for k in cfg["methods"][cell.method]["rl_experts"])
    return [
        {"experts": sorted(experts), "max_new_tokens": cap, "max_truncated_share": share}
        for (cap, share), experts in sorted(caps.items())
    ]
