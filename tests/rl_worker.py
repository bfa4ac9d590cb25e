"""One RL run in its own process, for tests/test_fault_injection.py and tests/test_vllm.py: MEML-GRPO
on a tiny random model (every rollout wrong, so the buffer fills and flushes every step), MLflow on,
with the rollout engine named by the optional last argument (default kv). With a fault
`<point>:<n>` the process SIGKILLs itself at the n-th time it reaches that point:
    rollouts    inside the n-th rollout call, before it returns
    checkpoint  halfway through writing the n-th checkpoint's state.pt
    flush       right after the n-th buffer flush (before that step's update and checkpoint)
    finish      inside rl_run.finish (n names the point: model, artifacts, closed, done, finished;
                none: no fault, the same settings):
                after the final model is written, inside MLflow's artifact upload, after the
                MLflow run is closed, after DONE, after finished.json; such a run keeps no
                checkpoints (rl.keep_checkpoints: false), so its removal comes last
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from meml.core.config import load_config
from meml.core.tracking import MLflowSettings, RunTracking
from meml.training import checkpoint, rl
from meml.training.buffer import HardExampleBuffer


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm_finish(where: str) -> None:
    from meml.core import tracking
    from meml.data import tiny_models
    from meml.training import rl_run

    if where == "model":
        save = tiny_models.save_atomically

        def save_then_die(*args: Any, **kwargs: Any) -> Any:
            save(*args, **kwargs)
            die()

        tiny_models.save_atomically = save_then_die  # type: ignore[assignment]
    elif where in ("artifacts", "closed"):
        method = "log_artifact" if where == "artifacts" else "close"
        original = getattr(tracking.Tracker, method)

        def then_die(self: Any, *args: Any, **kwargs: Any) -> Any:
            if method == "close" and not args:  # the run's own close (a kill closes it "KILLED")
                original(self, *args, **kwargs)
            die()

        setattr(tracking.Tracker, method, then_die)
    elif where != "none":  # done, finished: right after that file is written
        write = rl_run.atomic_write_json
        name = {"done": "DONE", "finished": "finished.json"}[where]

        def write_then_die(path: Path, *args: Any, **kwargs: Any) -> Any:
            write(path, *args, **kwargs)
            if Path(path).name == name:
                die()

        rl_run.atomic_write_json = write_then_die  # type: ignore[assignment]


def arm(fault: str) -> None:
    point, n = fault.split(":")
    if point == "finish":
        arm_finish(n)
        return
    left = [int(n)]

    def hit() -> bool:
        left[0] -= 1
        return left[0] == 0

    if point == "rollouts":
        original = rl.sample_groups

        def sample_groups(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            if hit():
                die()
            return out

        rl.sample_groups = sample_groups  # type: ignore[assignment]
    elif point == "checkpoint":
        save = checkpoint.torch.save

        def half_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
            if not hit():
                return save(obj, f, *args, **kwargs)
            import io

            buffer = io.BytesIO()
            save(obj, buffer)
            f.write(buffer.getvalue()[: buffer.tell() // 2])
            f.flush()
            die()

        checkpoint.torch.save = half_save  # type: ignore[assignment]
    elif point == "flush":
        drain = HardExampleBuffer.drain

        def drain_then_die(self: HardExampleBuffer) -> Any:
            items = drain(self)
            if hit():
                die()
            return items

        HardExampleBuffer.drain = drain_then_die  # type: ignore[method-assign]


def main(model: Path, world: Path, out: Path, store: str, fault: str, engine: str = "kv") -> None:
    if fault != "none":
        arm(fault)
    cfg = load_config()
    settings = json.loads(json.dumps(cfg["rl"]))
    settings.update(steps=4, questions_per_step=2, group_size=6, max_new_tokens=16, checkpoint_every=1,
                    rollout_batch_size=36, max_truncated_share=1.0, engine=engine)  # fmt: skip
    settings["buffer"].update(capacity=2)
    if fault.startswith("finish"):
        settings["keep_checkpoints"] = False
    method = rl.Method.from_config("MEML-GRPO", cfg["methods"]["MEML-GRPO"])
    args = rl.RLArgs(rl.RLSettings.from_config(settings), method, seed=1, params={"cell": "faults"})
    paths = rl.RLPaths(model, world / "data/gsm8k", world / "experts/gsm8k", out)
    mlflow = MLflowSettings(store, "faults")
    rl.run_rl(args, paths, RunTracking(f"faults/{out.name}", args.params, mlflow=mlflow), progress=False)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4], sys.argv[5], *sys.argv[6:])
