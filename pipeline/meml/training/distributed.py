"""Data parallelism for the RL loop, on top of the process group that `accelerate launch` sets up.

One process per GPU (or per CPU process with gloo, for the tests). Each process holds a full
replica of the policy. Per step:
    - every process draws the same Q questions (the question order is seeded alike) and takes
      its own block of Q / world of them, so all G rollouts of a question, from every expert,
      live in one process: IML and the buffer compare experts on complete groups;
    - the buffer's offers are gathered and replayed in rank order on every process, so the
      buffers stay identical; a flushed SFT batch is split among the processes;
    - gradients are averaged over processes before clipping, so the replicas stay identical;
    - rewards and metrics are gathered; only the main process writes metrics, checkpoints and the
      final model.
With one process every operation here is the identity, and the loop is the single-process one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from meml.core.io import DataError


@dataclass(frozen=True)
class Dist:
    rank: int
    world: int
    device: str  # "cpu", or "cuda:<local rank>"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, device: str) -> Dist:
        """One process (plain `python`), or the group `accelerate launch` / torchrun describe in
        the environment (WORLD_SIZE > 1): gloo on CPU, NCCL on GPU."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world == 1:
            return cls(0, 1, "cuda:0" if device == "cuda" else "cpu")
        from accelerate import PartialState

        state = PartialState(cpu=device == "cpu")
        where = "cpu" if device == "cpu" else f"cuda:{state.local_process_index}"
        return cls(state.process_index, state.num_processes, where)

    def block(self, items: list[Any]) -> list[Any]:
        """This process's contiguous share of a list whose length the world size divides."""
        if len(items) % self.world:
            raise DataError(
                f"{len(items)} questions a step cannot be split over {self.world} processes",
                None,
                None,
                "rl.questions_per_step",
            )
        size = len(items) // self.world
        return items[self.rank * size : (self.rank + 1) * size]

    def gather(self, obj: Any) -> list[Any]:
        """Every process's object, in rank order, on every process."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def average_gradients(self, model: Any) -> None:
        """The mean of every parameter's gradient over the processes (a parameter without a
        gradient in one process counts as zero there)."""
        if self.world == 1:
            return
        import torch
        import torch.distributed as dist

        for p in model.parameters():
            if not p.requires_grad:
                continue
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= self.world

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()
