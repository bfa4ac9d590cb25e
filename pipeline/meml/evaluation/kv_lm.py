"""lm-eval's HF model with the project's CPU sampling engine for generation (`eval.backend: kv`).

Everything lm-eval does stays as it is: the task YAMLs, the chat template, batching, the `until`
cut, filters and metrics. Only `_model_generate`, the call of `model.generate` on one left-padded
batch, goes through training/kv_decode.py instead: each row's prompt (its padding dropped), its
completion up to and including its stop token, then padding, in the shape lm-eval expects. Greedy
output is the same tokens as `model.generate` (tests/test_kv_decode.py), so scores do not move.
"""

from __future__ import annotations

from typing import Any

from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from meml.training.kv_decode import KVEngine
from meml.training.rollout import Sampling

NAME = "meml-kv"


@register_model(NAME)
class KVLM(HFLM):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.engine = KVEngine(self.model, self.tokenizer, batch_size=1 << 30)  # lm-eval sizes the batches

    def _model_generate(self, context: Any, max_length: int, stop: list[str], **generation_kwargs: Any) -> Any:
        import torch

        mask = generation_kwargs.pop("attention_mask", None)
        if mask is None:
            mask = torch.ones_like(context)
        width = context.shape[1]
        prompts = [row[m.bool()].tolist() for row, m in zip(context.cpu(), mask.cpu(), strict=True)]  # padding dropped
        temperature = float(generation_kwargs.get("temperature") or 0.0)
        greedy = not generation_kwargs.get("do_sample") or temperature == 0.0
        sampling = Sampling(
            max_new_tokens=max_length - width,
            temperature=temperature if not greedy else 1.0,
            top_p=float(generation_kwargs.get("top_p") or 1.0),
            greedy=greedy,
        )
        completions = self.engine.generate(prompts, 1, sampling)
        pad = self.tokenizer.pad_token_id
        out = torch.full((len(prompts), max_length), pad, dtype=torch.long)
        out[:, :width] = context.cpu()
        for row, [completion] in enumerate(completions):
            ids = completion.token_ids
            out[row, width : width + len(ids)] = torch.tensor(ids, dtype=torch.long)
        return out
