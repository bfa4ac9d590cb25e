"""The CPU sampling engine (`rl.engine: kv`): a decoding loop of plain tensor operations over the
policy's own weights, with a preallocated key/value cache.

Why: on a CPU, `model.generate` spends most of a step on per-token bookkeeping (the dynamic cache's
concatenations, mask building, logits processors, module calls), not arithmetic: a tiny model's
forward is a few hundred kFLOP a row. This loop does only the arithmetic:

    prefill   each distinct prompt once, unpadded (B=1, causal): its keys and values are written
              into the rows of all its copies, left-aligned so that every row writes its next
              token at the same cache column
    decode    one token for every active row per step: embed, L x (RMSNorm, fused q/k/v
              projection, rotary, attention over the cache with a padding mask, output
              projection, RMSNorm, fused gate/up, SiLU, down), final norm, logits of the last
              position only
    sample    greedy: argmax. Otherwise temperature, top-p as transformers does it, and one draw
              per row by the inverse cumulative distribution (one uniform a row), from torch's
              global generator (seeded, resumable)
    leave     a row that samples a stop token (stops.py) is done; done rows keep riding in the
              batch until they are a quarter of it, then the batch and its cache are compacted

Shapes: B rows, H query heads, Hkv key/value heads, D head size, T = widest prompt + max_new_tokens.
Cache per layer: (B, Hkv, T, D) for keys and for values; column c holds the token at column c of
the left-padded row (pad columns are zeros and masked out).

The operations are transformers' own, in the same order (RMSNorm in float32, rotary from the
model's own rotary module, SDPA with shared key/value heads), so greedy output is the same tokens
as `model.generate` (tests/test_kv_decode.py checks every prompt of a batch on the tiny models).
The arithmetic is not bit-identical (other batch shapes, no padding in the prefill), so a
near-tie between two tokens could break the other way; the test would show it.

Supported: decoder-only Llama-family models (model_type llama, qwen2: the tiny models, SmolLM2,
Qwen2.5, Llama-3.2) with full attention; anything else raises UnsupportedModel (use `rl.engine: hf`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from meml.core.precision import Precision
from meml.training.rollout import Completion, HFEngine, Sampling

SUPPORTED = ("llama", "qwen2")
COMPACT_BELOW = 0.75  # compact the batch when fewer than this share of its rows are still active


class UnsupportedModel(ValueError):
    """A model this loop does not implement."""


def _check_supported(model: Any) -> None:
    config = model.config
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED:
        raise UnsupportedModel(f"the kv engine runs {', '.join(SUPPORTED)} models, not '{kind}' (use rl.engine: hf)")
    layer_types = getattr(config, "layer_types", None) or []
    if getattr(config, "use_sliding_window", False) or any(t != "full_attention" for t in layer_types):
        raise UnsupportedModel("the kv engine has no sliding-window attention (use rl.engine: hf)")
    if getattr(config, "mlp_bias", False) or getattr(config, "hidden_act", "silu") != "silu":
        raise UnsupportedModel("the kv engine runs SiLU MLPs without bias (use rl.engine: hf)")


def rms_norm(x: Any, weight: Any, eps: float) -> Any:
    """transformers' RMSNorm (float32 statistics). On float32 input, torch's fused rms_norm: the
    same values bit for bit (checked in tests/test_kv_decode.py) in one call instead of seven."""
    import torch
    import torch.nn.functional as F

    dtype = x.dtype
    if dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def rotate(x: Any, cos: Any, sin: Any) -> Any:
    """Rotary position embedding: x * cos + rotate_half(x) * sin."""
    import torch

    half = x.shape[-1] // 2
    return (x * cos) + (torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin)


def decode_attention(q: Any, keys: Any, values: Any, bias: Any, scale: float) -> Any:
    """Attention of one new token per row over the cache, the query heads that share a key/value
    head stacked as rows of one matrix product: q (B, H, 1, D), keys and values (B, Hkv, S, D),
    bias (B, 1, 1, S) -> (B, H, 1, D). Each key/value head is read once for all its query heads;
    SDPA's kernel (with `enable_gqa`) read it once per query head and spent 34% of a decoding
    batch there (the toy study's MEF model, torch.profiler). The same arithmetic: softmax of
    q.k * scale over the unmasked columns, times the values."""
    b, h, _, d = q.shape
    kv = keys.shape[1]
    grouped = q.reshape(b, kv, h // kv, d)  # query head j*G + g is served by key/value head j
    scores = (grouped @ keys.transpose(-1, -2)).mul_(scale).add_(bias)  # (B, Hkv, G, S)
    return (scores.softmax(dim=-1) @ values).reshape(b, h, 1, d)


class KVDecoder:
    """The model's forward as tensor operations over its own parameters. Built for each generate
    call (the fused projections are concatenations of the current weights, so after an optimiser
    step the next call samples from the new policy)."""

    def __init__(self, model: Any) -> None:
        import torch

        _check_supported(model)
        config = model.config
        inner = model.model
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        self.embed = inner.embed_tokens.weight
        self.final_norm = inner.norm.weight
        self.lm_head = model.lm_head.weight
        self.rotary = inner.rotary_emb
        self.layers = []
        for block in inner.layers:
            attn, mlp = block.self_attn, block.mlp
            projections = (attn.q_proj, attn.k_proj, attn.v_proj)
            biases = [p.bias for p in projections]
            self.layers.append(
                {
                    "norm_in": block.input_layernorm.weight,
                    "qkv": torch.cat([p.weight for p in projections]),
                    "qkv_bias": torch.cat(biases) if all(b is not None for b in biases) else None,
                    "o": attn.o_proj.weight,
                    "o_bias": attn.o_proj.bias,
                    "norm_post": block.post_attention_layernorm.weight,
                    "gate_up": torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
                    "down": mlp.down_proj.weight,
                }
            )
        self.scaling = self.head_dim**-0.5
        self.dtype = self.embed.dtype

    def rotary_table(self, length: int) -> tuple[Any, Any]:
        """cos and sin for positions 0..length-1, (length, D), from the model's own rotary module."""
        import torch

        positions = torch.arange(length, device=self.embed.device)[None]
        like = torch.zeros((1, 1, 1), dtype=self.dtype, device=self.embed.device)  # it reads dtype and device only
        cos, sin = self.rotary(like, positions)
        return cos[0], sin[0]

    def forward(self, x: Any, cos: Any, sin: Any, cache: list[tuple[Any, Any]], column: int, mask: Any) -> Any:
        """x (B, t, hidden) of t new tokens written at cache columns [column, column + t);
        cos, sin (B, t, D); mask (B, 1, t, column + t) boolean or None for a causal prefill without
        padding. Returns the final hidden state of the last position, (B, hidden)."""
        import torch
        import torch.nn.functional as F

        b, t, _ = x.shape
        h_dim, q_size, kv_size = self.head_dim, self.heads * self.head_dim, self.kv_heads * self.head_dim
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, t, D): broadcast over heads
        end = column + t
        decoding = t == 1 and mask is not None
        if decoding:  # the padding mask as a bias added to the scores, built once for every layer
            bias = torch.zeros(mask.shape, dtype=x.dtype, device=x.device).masked_fill_(~mask, float("-inf"))
        for layer, (keys, values) in zip(self.layers, cache, strict=True):
            h = rms_norm(x, layer["norm_in"], self.eps)
            qkv = F.linear(h, layer["qkv"], layer["qkv_bias"])
            # queries and keys rotated in one go: (B, H + Hkv, t, D)
            qk = rotate(
                qkv[..., : q_size + kv_size].view(b, t, self.heads + self.kv_heads, h_dim).transpose(1, 2), cos, sin
            )
            q, k = qk[:, : self.heads], qk[:, self.heads :]
            v = qkv[..., q_size + kv_size :].view(b, t, self.kv_heads, h_dim).transpose(1, 2)
            keys[:, :, column:end] = k
            values[:, :, column:end] = v
            if decoding:
                a = decode_attention(q, keys[:, :, :end], values[:, :, :end], bias, self.scaling)
            else:
                a = F.scaled_dot_product_attention(
                    q,
                    keys[:, :, :end],
                    values[:, :, :end],
                    attn_mask=mask,
                    scale=self.scaling,
                    is_causal=mask is None and t > 1,
                    enable_gqa=self.kv_heads != self.heads,
                )
            x = x + F.linear(a.transpose(1, 2).reshape(b, t, q_size), layer["o"], layer["o_bias"])
            h = rms_norm(x, layer["norm_post"], self.eps)
            gate, up = F.linear(h, layer["gate_up"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer["down"])
        return rms_norm(x[:, -1], self.final_norm, self.eps)

    def logits(self, hidden: Any) -> Any:
        import torch.nn.functional as F

        return F.linear(hidden, self.lm_head).float()


def top_p_filter(logits: Any, top_p: float) -> Any:
    """transformers' top-p: sort ascending, drop the tokens whose cumulative probability (from the
    least likely up) stays at or below 1 - top_p, always keep the most likely one."""
    import torch

    if top_p >= 1.0:
        return logits
    ascending, order = torch.sort(logits, descending=False)
    drop = ascending.softmax(dim=-1).cumsum(dim=-1) <= (1 - top_p)
    drop[..., -1:] = False
    return logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))


def choose(logits: Any, sampling: Sampling) -> tuple[Any, Any]:
    """One token per row of logits (B, V), and its log-probability under the distribution it was
    drawn from (B,): argmax when greedy (its log-prob under softmax(logits)), else a draw from softmax(logits / T)
    after top-p, by the inverse of its cumulative distribution: one uniform u per row, the first
    token whose cumulative probability exceeds u * total. A token of probability 0 (cut by top-p)
    never exceeds the sum before it, so it is never drawn. One random number a row, where an
    exponential race (or torch.multinomial) draws one per vocabulary entry: on this machine 0.46 ms
    against 5.2 ms a step for 64 rows x 1,081 tokens (scripts/bench_engine.py's batch)."""
    import torch

    if sampling.greedy:
        chosen = logits.argmax(dim=-1)
        return chosen, logits.log_softmax(dim=-1).gather(1, chosen[:, None]).squeeze(1)
    log_probs = top_p_filter(logits / sampling.temperature, sampling.top_p).log_softmax(dim=-1)
    probs = log_probs.exp()
    cumulative = probs.cumsum(dim=-1)
    total = cumulative[:, -1:]
    # u in [0, 1) times the total can round up to the total itself; stay just below it
    u = torch.minimum(torch.rand(total.shape, dtype=total.dtype, device=total.device) * total,
                      torch.nextafter(total, torch.zeros_like(total)))  # fmt: skip
    chosen = torch.searchsorted(cumulative, u, right=True).squeeze(1)
    return chosen, log_probs.gather(1, chosen[:, None]).squeeze(1)


class KVEngine(HFEngine):
    """RolloutEngine over KVDecoder: like HFEngine it samples from the policy module's own weights
    (no copy, so no fingerprint); every prompt's copies go in one batch of at most `batch_size` rows."""

    def __init__(self, model: Any, tokenizer: Any, batch_size: int = 64, precision: Precision | None = None) -> None:
        _check_supported(model)
        if next(model.parameters()).device.type != "cpu":  # its bookkeeping tensors live on the CPU
            raise UnsupportedModel("the kv engine runs on a CPU (on a GPU: rl.engine: hf or vllm)")
        super().__init__(model, tokenizer, batch_size, precision)  # the policy module, its stop tokens

    def generate(
        self, prompts: Sequence[Sequence[int]], n: int | Sequence[int], sampling: Sampling
    ) -> list[list[Completion]]:
        counts = [n] * len(prompts) if isinstance(n, int) else list(n)
        out: list[list[Completion]] = [[] for _ in prompts]
        chunk: list[int] = []  # prompt indices whose copies go into one batch
        for i, k in enumerate(counts):
            if chunk and sum(counts[j] for j in chunk) + k > self.batch_size:
                self._run(prompts, counts, chunk, sampling, out)
                chunk = []
            chunk.append(i)
        if chunk:
            self._run(prompts, counts, chunk, sampling, out)
        return out

    def _run(
        self,
        prompts: Sequence[Sequence[int]],
        counts: list[int],
        chunk: list[int],
        sampling: Sampling,
        out: list[list[Completion]],
    ) -> None:
        with self.precision.autocast():  # bf16 runs sample in bf16, as they train (precision.py)
            batch = decode_rows(self, [list(prompts[i]) for i in chunk], [counts[i] for i in chunk], sampling)
        for i, completions in zip(chunk, batch, strict=True):
            out[i].extend(completions)


def decode_rows(
    engine: KVEngine, prompts: list[list[int]], counts: list[int], sampling: Sampling
) -> list[list[Completion]]:
    """Sample counts[i] completions of prompts[i], all in one batch (see the module's docstring)."""
    import torch

    model = engine.model
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            decoder = KVDecoder(model)
            tokens = _decode(decoder, prompts, counts, sampling, engine.stops.ids)
    finally:
        if was_training:
            model.train()
    out: list[list[Completion]] = []
    for row_tokens in tokens:
        group = []
        for ids, finished, logprobs in row_tokens:
            text = engine.tokenizer.decode(ids, skip_special_tokens=True)
            group.append(Completion(ids, text, finished, tuple(logprobs)))
        out.append(group)
    return out


def _decode(
    decoder: KVDecoder, prompts: list[list[int]], counts: list[int], sampling: Sampling, stop_ids: Sequence[int]
) -> list[list[tuple[list[int], bool, list[float]]]]:
    import torch

    device, dtype = decoder.embed.device, decoder.dtype
    rows = sum(counts)
    width = max(len(p) for p in prompts)
    length = width + sampling.max_new_tokens
    cos_table, sin_table = decoder.rotary_table(length)
    shape = (rows, decoder.kv_heads, length, decoder.head_dim)
    cache = [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
             for _ in decoder.layers]  # fmt: skip
    valid = torch.zeros((rows, length), dtype=torch.bool, device=device)  # which cache columns a row attends to
    valid[:, width:] = True
    lengths = torch.empty(rows, dtype=torch.long)  # each row's prompt length: its next position
    first_logits = []

    # prefill: each distinct prompt once, unpadded; its keys and values go to all of its copies
    row = 0
    for prompt, k in zip(prompts, counts, strict=True):
        p = len(prompt)
        one = [
            (torch.zeros((1, decoder.kv_heads, p, decoder.head_dim), dtype=dtype, device=device),
             torch.zeros((1, decoder.kv_heads, p, decoder.head_dim), dtype=dtype, device=device))
            for _ in decoder.layers
        ]  # fmt: skip
        x = decoder.embed[torch.tensor(prompt, device=device)][None]
        hidden = decoder.forward(x, cos_table[None, :p], sin_table[None, :p], one, 0, None)
        for (keys, values), (k1, v1) in zip(cache, one, strict=True):
            keys[row : row + k, :, width - p : width] = k1
            values[row : row + k, :, width - p : width] = v1
        valid[row : row + k, width - p : width] = True
        lengths[row : row + k] = p
        first_logits.append(decoder.logits(hidden).expand(k, -1))
        row += k

    stops = torch.tensor(list(stop_ids), dtype=torch.long)
    generated = torch.zeros((rows, sampling.max_new_tokens), dtype=torch.long)
    drawn_logp = torch.zeros((rows, sampling.max_new_tokens))  # each token's log-prob where it was drawn
    steps_done = torch.zeros(rows, dtype=torch.long)  # tokens generated per original row
    finished = torch.zeros(rows, dtype=torch.bool)
    index = torch.arange(rows)  # original row of each batch row
    active = torch.ones(rows, dtype=torch.bool)  # batch rows still generating
    logits = torch.cat(first_logits)
    for step in range(sampling.max_new_tokens):
        chosen, chosen_logp = choose(logits, sampling)
        live = index[active]
        generated[live, step] = chosen[active]
        drawn_logp[live, step] = chosen_logp[active].float()
        steps_done[live] = step + 1
        stopped = torch.isin(chosen, stops) & active
        finished[index[stopped]] = True
        active &= ~stopped
        alive = int(active.sum())
        if alive == 0 or step + 1 == sampling.max_new_tokens:
            break
        if alive < COMPACT_BELOW * len(index):  # drop done rows from the batch and its cache
            keep = active.nonzero().squeeze(1)
            cache = [(keys.index_select(0, keep), values.index_select(0, keep)) for keys, values in cache]
            valid, lengths, chosen, index = valid[keep], lengths[keep], chosen[keep], index[keep]
            active = torch.ones(len(keep), dtype=torch.bool)
        column = width + step
        positions = lengths + step
        x = decoder.embed[chosen][:, None]
        mask = valid[:, None, None, : column + 1]
        hidden = decoder.forward(x, cos_table[positions][:, None], sin_table[positions][:, None], cache, column, mask)
        logits = decoder.logits(hidden)

    out: list[list[tuple[list[int], bool, list[float]]]] = []
    row = 0
    for k in counts:
        group = []
        for r in range(row, row + k):
            ids = generated[r, : int(steps_done[r])].tolist()
            group.append((ids, bool(finished[r]), drawn_logp[r, : int(steps_done[r])].tolist()))
        out.append(group)
        row += k
    return out
