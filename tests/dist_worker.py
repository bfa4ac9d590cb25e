"""Run by tests/test_distributed.py in each of two CPU processes (gloo) under `accelerate launch`:
SFT, then every method of the default grid (and two extras) for two RL steps on the tiny model,
with the hf-copy engine (weights synced and checked every step), then MEML with a scripted engine
under which IML and HSFT fire on every question."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from scripted import ScriptedEngine, train  # expert 1 right, the others wrong: IML and HSFT fire

from meml.core.config import load_config
from meml.core.records import read_records
from meml.training.rl import Method
from meml.training.sft import run_sft


def main(world: Path, base: Path, out: Path) -> None:
    from transformers import AutoTokenizer

    rank = int(os.environ["RANK"])
    cfg = load_config()
    data, experts = world / "data/gsm8k", world / "experts/gsm8k"
    sft = run_sft(base, data, experts, out / "sft", [0, 1, 2], dict(cfg["sft"], epochs=1, max_length=256))
    settings = json.loads(json.dumps(cfg["rl"]))
    settings.update(steps=2, questions_per_step=2, group_size=6, max_new_tokens=12, checkpoint_every=1,
                    rollout_batch_size=16, engine="hf-copy", max_truncated_share=1.0)  # fmt: skip
    settings["buffer"].update(capacity=2)
    model = out / "sft" / "model"
    for name in [*cfg["grid"]["methods"], "MoE-SFT-GRPO+DS", "MEML-per_expert"]:
        entry = cfg["methods"][name]
        train({**settings, **entry.get("rl", {})}, Method.from_config(name, entry), model, data, experts,
               out / "rl" / name, progress=False)  # fmt: skip
    answers = {r.question: r.answer for r in read_records(data / "train.jsonl")}
    engine = ScriptedEngine(AutoTokenizer.from_pretrained(model), answers)
    meml = Method.from_config("MEML-GRPO", cfg["methods"]["MEML-GRPO"])
    train(settings, meml, model, data, experts, out / "rl" / "scripted", engine=engine, progress=False)
    # each process says it finished; the replicas are compared inside run_rl at every step
    (out / f"rank{rank}.json").write_text(json.dumps({"sft_processes": sft["processes"]}))


if __name__ == "__main__":
    main(*(Path(a) for a in sys.argv[1:4]))
