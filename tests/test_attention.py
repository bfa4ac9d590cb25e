"""The CPU attention kernel (core/attention.py): bit-identical numbers to transformers' sdpa, and
without the per-call copy of shared key/value heads where no gradient is taken."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from meml.core.attention import NAME, attention_kwargs


def _tiny(tmp_path: Path, kv_heads: int) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    folder = tmp_path / f"kv{kv_heads}"
    Qwen2ForCausalLM(config).save_pretrained(folder)
    return folder


def _pair(folder: Path) -> tuple[object, object]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(
        folder, **attention_kwargs("cpu")
    )


def _left_padded() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(5, 295, (3, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    mask[1, :1] = 0
    return ids, mask


@pytest.mark.parametrize("kv_heads", [2, 4])
def test_logits_and_gradients_match_sdpa(tmp_path: Path, kv_heads: int) -> None:
    reference, ours = _pair(_tiny(tmp_path, kv_heads))
    assert ours.config._attn_implementation == NAME
    ids, mask = _left_padded()
    out_ref = reference(input_ids=ids, attention_mask=mask, labels=ids)
    out_ours = ours(input_ids=ids, attention_mask=mask, labels=ids)
    real = mask.bool()  # padded positions' logits are not used by anything
    assert torch.equal(out_ref.logits[real], out_ours.logits[real])
    out_ref.loss.backward()
    out_ours.loss.backward()
    for (name, a), (_, b) in zip(reference.named_parameters(), ours.named_parameters(), strict=True):
        assert torch.equal(a.grad, b.grad), name  # training takes transformers' path: the same sums
    with torch.no_grad():
        assert torch.equal(
            reference(input_ids=ids, attention_mask=mask).logits[real],
            ours(input_ids=ids, attention_mask=mask).logits[real],
        )
        full = torch.ones_like(ids)  # no padding: the causal path without a mask
        assert torch.equal(
            reference(input_ids=ids, attention_mask=full).logits, ours(input_ids=ids, attention_mask=full).logits
        )


@pytest.mark.parametrize("sample", [False, True])
def test_decoding_with_a_cache_gives_the_same_tokens(tmp_path: Path, sample: bool) -> None:
    reference, ours = _pair(_tiny(tmp_path, 2))
    ids, mask = _left_padded()
    kwargs = {"max_new_tokens": 64, "min_new_tokens": 64, "do_sample": sample, "top_k": 0, "pad_token_id": 0}
    with torch.no_grad():
        torch.manual_seed(3)
        expected = reference.generate(input_ids=ids, attention_mask=mask, **kwargs)
        torch.manual_seed(3)
        assert torch.equal(expected, ours.generate(input_ids=ids, attention_mask=mask, **kwargs))


def test_shared_heads_are_not_copied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The point of the kernel: transformers' sdpa repeats the key/value heads under a mask; ours does not."""
    import transformers.integrations.sdpa_attention as sdpa

    def refuse(*args: object) -> None:
        raise AssertionError("key/value heads copied")

    monkeypatch.setattr(sdpa, "repeat_kv", refuse)
    reference, ours = _pair(_tiny(tmp_path, 2))
    ids, mask = _left_padded()
    with torch.no_grad():
        ours(input_ids=ids, attention_mask=mask)
        with pytest.raises(AssertionError, match="copied"):
            reference(input_ids=ids, attention_mask=mask)


def test_gpus_keep_transformers_choice() -> None:
    assert attention_kwargs("cuda") == {}
    assert attention_kwargs("cuda:1") == {}
    assert attention_kwargs("cpu") == {"attn_implementation": NAME}
