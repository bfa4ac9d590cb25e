"""Where a turn ends: one set of stop tokens derived from the tokenizer and its chat template.

A base model's eos may be `<|endoftext|>` while its chat template closes every turn with
`<|im_end|>` (Qwen2.5 base models have shipped so), and Llama-3.2-Instruct closes turns with
`<|eot_id|>`. Stopping on eos alone would let every rollout run on to max_new_tokens after its
answer. So every place that samples or writes an assistant turn reads this one object:
    the rollout engines (HF and vLLM)     stop on any of `ids`
    evaluation (lm-eval `until`)          stops on any of `texts`
    HSFT targets                          end with `end_of_turn`, as the chat template's turns do
    SFT (trl)                             renders turns with the template, so ends the same way
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_MARK = "\u2063MEML-END-OF-CONTENT\u2063"  # text no template produces by itself


@dataclass(frozen=True)
class StopTokens:
    end_of_turn: int  # the token the chat template puts after an assistant message
    ids: tuple[int, ...]  # every token that ends a turn: end_of_turn first, then eos if it differs
    texts: tuple[str, ...]  # the same tokens as strings (lm-eval's `until`)


def stop_tokens(tokenizer: Any) -> StopTokens:
    """The end-of-turn token is the first token the chat template writes after an assistant
    message's content; eos is a stop token too. Without a chat template (or one that writes
    nothing special after the content) the end of a turn is eos."""
    eos = tokenizer.eos_token_id
    end = _template_end_of_turn(tokenizer)
    end_of_turn = eos if end is None else end
    ids = tuple(dict.fromkeys(t for t in (end_of_turn, eos) if t is not None))
    if not ids:
        raise ValueError("the tokenizer has neither an eos token nor a chat template that ends a turn")
    return StopTokens(end_of_turn, ids, tuple(tokenizer.convert_ids_to_tokens(list(ids))))


def _template_end_of_turn(tokenizer: Any) -> int | None:
    if not getattr(tokenizer, "chat_template", None):
        return None
    messages = [{"role": "user", "content": "question"}, {"role": "assistant", "content": _MARK}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    if _MARK not in rendered:
        return None
    after = rendered.split(_MARK, 1)[1]
    special = set(tokenizer.all_special_ids) | {
        i for i, t in tokenizer.added_tokens_decoder.items() if getattr(t, "special", False)
    }
    for token in tokenizer(after, add_special_tokens=False)["input_ids"]:
        if token in special:
            return int(token)
        if tokenizer.decode([token]).strip():
            return None  # ordinary text after the content: the template marks no end of turn
    return None


def target_ids(tokenizer: Any, text: str, stops: StopTokens) -> list[int]:
    """An assistant turn as a training target (HSFT): the text's tokens, then the end-of-turn token."""
    return [*tokenizer(text, add_special_tokens=False)["input_ids"], stops.end_of_turn]
