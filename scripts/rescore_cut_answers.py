"""Score a profile's evaluations again under the rule that an answer cut at the token cap is wrong,
from the responses they stored (nothing is generated): for results written before that rule.

    .venv/bin/python scripts/rescore_cut_answers.py --configfile config/real-model.yaml
    .venv/bin/python scripts/rescore_cut_answers.py --configfile config/real-model.yaml config/real-model-vllm.yaml

Each results/<profile>/eval/**/*.json is rewritten in place (atomically) with today's fields
(strict and lenient with cut answers wrong, `finished`, `cut_correct_looking`, lm-eval's own scores
as `lm_eval`) and marked `rescored`; one already in today's format is left alone. Then rebuild the
report (`snakemake ... --rerun-triggers mtime`: the evaluations are newer than their inputs, so only
the report runs). The RL runs themselves are not retrained: where their reward counted cut answers,
the report of a rescored profile says so in its index.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))

from meml.core.config import DEFAULT_CONFIG, deep_merge, validate
from meml.core.io import atomic_write_json, read_json
from meml.core.records import read_records
from meml.plan.grid import eval_max_new_tokens
from meml.plan.layout import Layout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configfile", nargs="+", required=True, help="the config files the run was made with")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from meml.evaluation.evaluate import rescore

    merged = yaml.safe_load(DEFAULT_CONFIG.read_text())
    for path in args.configfile:
        merged = deep_merge(merged, yaml.safe_load(Path(path).read_text()) or {})
    cfg = validate(merged, " + ".join(args.configfile))
    layout = Layout.of(cfg)
    tokenizers: dict[str, object] = {}
    for path in sorted((layout.root / "eval").rglob("*.json")):
        report = read_json(path)
        changed = False
        for block in ("model", "base"):
            part = report.get(block)
            if not part or all("cut_correct_looking" in e for e in part["experts"].values()):
                continue
            dataset = part["dataset"]
            records = read_records(layout.data(cfg["world"], dataset) / "test.jsonl", dataset)
            checkpoint = part["checkpoint"]
            if checkpoint not in tokenizers:
                tokenizers[checkpoint] = AutoTokenizer.from_pretrained(checkpoint)
            rescore(part, records, eval_max_new_tokens(cfg, dataset), tokenizers[checkpoint])
            changed = True
        if changed:
            atomic_write_json(path, report)
            print(f"rescored {path}")


if __name__ == "__main__":
    main()
