"""Tiny local models: one tokenizer in both folders, chat template, offline load and generation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from meml.core.records import read_records
from meml.data.experts import DEFAULT_PROMPTS, chat_messages
from meml.data.tiny_models import build_tiny_models, toy_corpus


@pytest.fixture(scope="module")
def models(small_world: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("models")
    return build_tiny_models(toy_corpus(small_world, DEFAULT_PROMPTS), out, seed=0, vocab_size=600)


def test_both_folders_tokenize_identically(models: dict[str, Path], small_world: Path) -> None:
    qwen = AutoTokenizer.from_pretrained(models["qwen2"])
    llama = AutoTokenizer.from_pretrained(models["llama"])
    text = "Mia has 1,450 apples.\n#### 1450 <think>x</think> So the answer is yes."
    assert qwen(text)["input_ids"] == llama(text)["input_ids"]
    # digits are split one by one, as in Qwen2's pre-tokenisation
    assert qwen.convert_ids_to_tokens(qwen("1450")["input_ids"]) == ["1", "4", "5", "0"]
    assert qwen.eos_token == "<|im_end|>" and qwen.pad_token == "<|endoftext|>"


def test_chat_template_has_system_prompt_and_marks_assistant(models: dict[str, Path], small_world: Path) -> None:
    tok = AutoTokenizer.from_pretrained(models["qwen2"])
    record = read_records(small_world / "data/gsm8k/train.jsonl")[0]
    messages = [*chat_messages(record, 2), {"role": "assistant", "content": "#### 5"}]
    text = tok.apply_chat_template(messages, tokenize=False)
    assert text.startswith("<|im_start|>system\n" + DEFAULT_PROMPTS[2])
    encoded = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    ids, mask = encoded["input_ids"], encoded["assistant_masks"]
    assistant = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert assistant == "#### 5<|im_end|>"


def test_models_load_offline_and_generate(models: dict[str, Path]) -> None:
    sizes = {}
    for kind, folder in models.items():
        tok = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder)
        sizes[kind] = sum(p.numel() for p in model.parameters())
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": "hi"}], add_generation_prompt=True, return_dict=True, return_tensors="pt"
        )
        out = model.generate(**prompt, max_new_tokens=5, do_sample=False)
        new = out[0, prompt["input_ids"].shape[1] :].tolist()
        assert 1 <= len(new) <= 5 and all(0 <= t < model.config.vocab_size for t in new)
        again = model.generate(**prompt, max_new_tokens=5, do_sample=False)
        assert torch.equal(out, again)  # greedy decoding of a saved model is deterministic
        assert model.config.model_type == kind  # each folder holds its own architecture
    assert sizes["llama"] < sizes["qwen2"]  # the weaker stand-in is the smaller one


def test_same_seed_same_weights_built_alone_or_beside_another(small_world: Path, tmp_path: Path) -> None:
    # the workflow builds each model in its own job (models.smk): a model must not depend on which
    # others are built, or adding one to the grid would change the first one's cells
    corpus = toy_corpus(small_world, DEFAULT_PROMPTS)
    a = build_tiny_models(corpus, tmp_path / "a", seed=1, vocab_size=500, kinds=["llama"])
    b = build_tiny_models(corpus, tmp_path / "b", seed=1, vocab_size=500, kinds=["qwen2", "llama"])
    assert (a["llama"] / "tokenizer.json").read_bytes() == (b["llama"] / "tokenizer.json").read_bytes()
    wa = AutoModelForCausalLM.from_pretrained(a["llama"]).state_dict()
    wb = AutoModelForCausalLM.from_pretrained(b["llama"]).state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_unknown_model_kind_is_a_clear_error(small_world: Path, tmp_path: Path) -> None:
    from meml.core.io import DataError

    with pytest.raises(DataError, match="unknown tiny model 'gpt2'; known: qwen2, llama"):
        build_tiny_models(toy_corpus(small_world, DEFAULT_PROMPTS), tmp_path, seed=0, vocab_size=400, kinds=["gpt2"])
