"""Rollouts stop where the turn ends, also when the tokenizer's eos is another token (as in
Qwen2.5 base models and Llama-3.2-Instruct); HSFT targets and evaluation use the same tokens."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from meml.core.stops import stop_tokens, target_ids
from meml.data.tiny_models import train_tokenizer
from meml.evaluation.evaluate import generation_overrides
from meml.training.rollout import HFEngine, Sampling, vllm_sampling_kwargs

CORPUS = ["The answer is 12.\n#### 12", "So the answer is yes.", "answer : c"] * 20


@pytest.fixture(scope="module")
def qwen_base() -> Any:
    return train_tokenizer(CORPUS, 300, "qwen-base")


def test_end_of_turn_comes_from_the_chat_template(qwen_base: Any) -> None:
    stops = stop_tokens(qwen_base)
    im_end, endoftext = qwen_base.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert qwen_base.eos_token_id == endoftext != im_end  # the shape that broke RL rollouts
    assert stops.end_of_turn == im_end and stops.ids == (im_end, endoftext)
    assert stops.texts == ("<|im_end|>", "<|endoftext|>")
    llama = stop_tokens(train_tokenizer(CORPUS, 300, "llama-instruct"))
    assert llama.texts == ("<|eot_id|>", "<|end_of_text|>")
    toy = stop_tokens(train_tokenizer(CORPUS, 300, "toy"))
    assert toy.texts == ("<|im_end|>",)  # eos and end of turn are one token


class _ScriptedLM(torch.nn.Module):
    """generate() appends a fixed continuation to every prompt and records its arguments."""

    def __init__(self, continuation: list[int]) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.continuation, self.kwargs = continuation, {}

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        self.kwargs = kwargs
        tail = torch.tensor([self.continuation] * input_ids.shape[0])
        return torch.cat([input_ids, tail], dim=1)


def test_hf_engine_stops_at_the_end_of_turn_not_only_at_eos(qwen_base: Any) -> None:
    im_end, endoftext = qwen_base.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    answer = qwen_base("#### 12", add_special_tokens=False)["input_ids"]
    junk = qwen_base(" So the answer is yes.", add_special_tokens=False)["input_ids"]
    model = _ScriptedLM([*answer, im_end, *junk, endoftext])
    engine = HFEngine(model, qwen_base, 8)
    [[done]] = engine.generate([[5, 6]], 1, Sampling(max_new_tokens=len(model.continuation)))
    assert done.token_ids == [*answer, im_end] and done.finished and done.text == "#### 12"
    assert set(model.kwargs["eos_token_id"]) == {im_end, endoftext}  # generate itself stops on both
    model.continuation = [*answer, endoftext, *junk]
    [[done]] = engine.generate([[5, 6]], 1, Sampling(max_new_tokens=len(model.continuation)))
    assert done.token_ids == [*answer, endoftext] and done.finished
    assert vllm_sampling_kwargs(Sampling(), 2, engine.stops.ids)["stop_token_ids"] == [im_end, endoftext]


def test_hsft_targets_end_like_the_templates_assistant_turn(qwen_base: Any) -> None:
    stops = stop_tokens(qwen_base)
    target = target_ids(qwen_base, "#### 12", stops)
    assert target[-1] == stops.end_of_turn != qwen_base.eos_token_id
    rendered = qwen_base.apply_chat_template(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "#### 12"}],
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    turn = [t for t, m in zip(rendered["input_ids"], rendered["assistant_masks"], strict=True) if m]
    assert turn == target  # what SFT (trl, assistant-only loss) trains on ends the same way


def test_evaluation_stops_on_the_same_tokens(qwen_base: Any) -> None:
    assert generation_overrides(qwen_base, 64) == {"until": ["<|im_end|>", "<|endoftext|>"], "max_gen_toks": 64}
    assert generation_overrides(qwen_base, None) == {"until": ["<|im_end|>", "<|endoftext|>"]}


def test_sft_counts_the_examples_it_would_cut(qwen_base: Any) -> None:
    from meml.training.sft import truncated_share

    def example(answer: str) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": answer}]}

    short, long = example("#### 12"), example("The answer is 12. " * 40 + "#### 12")
    lengths = [
        len(qwen_base.apply_chat_template(e["messages"], tokenize=True, return_dict=True)["input_ids"])
        for e in (short, long)
    ]
    cap = (lengths[0] + lengths[1]) // 2  # between the two: only the long one is cut
    assert truncated_share(qwen_base, [short, long, short, short], cap) == 0.25
    assert truncated_share(qwen_base, [short, long], max(lengths)) == 0.0
