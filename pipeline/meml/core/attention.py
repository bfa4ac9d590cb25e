"""The attention kernel a model loads with: on a CPU, PyTorch's SDPA with shared key/value heads.

Both tiny models and both of the paper's models have fewer key/value heads than query heads
(grouped-query attention). With an attention mask, which every left-padded batch has,
transformers' `sdpa` kernel copies each key/value head once per query head it serves before
every call; on a CPU, decoding spends more time in that copy than in attention itself (an
evaluation job: 23 s of 57 s of model time, cProfile). PyTorch's scaled_dot_product_attention
can broadcast the shared heads itself (`enable_gqa`), the same arithmetic without the copy;
transformers uses that only when there is no mask. So on a CPU the models load with
`sdpa_shared_kv` below, which does that wherever no gradient is taken (generation: rollouts,
evaluation, calibration, complementarity); its logits are bit-identical to transformers' (tests/
test_attention.py), so every number a run produces stays the same. On a GPU the models keep
transformers' own choice (whose fused kernels take no `enable_gqa` with a mask).

    model = AutoModelForCausalLM.from_pretrained(path, **attention_kwargs(device))
"""

from __future__ import annotations

from typing import Any

NAME = "sdpa_shared_kv"


def _sdpa_shared_kv(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """query (B, H, Tq, D); key, value (B, Hkv, Tk, D) with H a multiple of Hkv -> (B, Tq, H, D)."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q_length, kv_length = query.shape[2], key.shape[2]
    training = torch.is_grad_enabled() and query.requires_grad
    if training or (attention_mask is None and q_length > 1 and kv_length != q_length):
        # Training: SDPA's backward sums the shared heads' gradients in another order (1e-8 apart),
        # which would move every trained number; the forward alone is bit-identical. A causal
        # prefill against a longer cache: transformers' kernel aligns that case itself.
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=bool(causal and attention_mask is None and q_length > 1),
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


def attention_kwargs(device: str) -> dict[str, str]:
    """from_pretrained's `attn_implementation` for a device: ours on a CPU, transformers' default elsewhere."""
    if device != "cpu":
        return {}
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, _sdpa_shared_kv)
    AttentionMaskInterface.register(NAME, sdpa_mask)  # the masks SDPA takes (None where causal suffices)
    return {"attn_implementation": NAME}
