"""Per-token log-probabilities of completions given their prompts: the scoring passes of the RL
update (policy, IML, HSFT, the old and reference policies), with each distinct prompt run once.

Why: in an RL batch every prompt is shared by all the rollouts of its (question, expert) subgroup
(3/3/2 of them with G = 8 split among three experts), and prompts are about half of a batch's
tokens (toy study: 5,064 prompt and 5,175 completion tokens in 64 rollouts). Scoring each row as
prompt + completion runs each prompt 2-3 times, forward and backward. Here:

    1. prompt pass   the P distinct prompts, right-padded, one pass through the decoder
                     -> their keys and values at every layer, and the logits at each prompt's last
                        token, which predict each completion's first token
    2. completion    rows sorted by completion length, `rows_per_pass` at a time: each row's
       passes        completion minus its last token, right-padded, attending to its own prompt's
                     keys and values (gathered from pass 1: the gradient flows back into pass 1
                     once per row) -> logits predicting completion tokens 1..len-1

The arithmetic is the model's own forward (transformers' layers, cache and masks), so the values
equal one unpadded pass per row to float32 rounding (tests/test_scoring.py: log-probs, entropies
and gradients). Padding costs little: prompts of one batch differ by a few tokens, and rows of
similar completion length share a pass. Models are any transformers causal LM with a decoder
(`get_decoder`) and an output embedding (`get_output_embeddings`); the cache must be transformers'
DynamicCache (full attention: the Llama family, Qwen2, SmolLM2).

Under gradient checkpointing (the GPU default with bf16) transformers' layers drop the cache in
training mode, so a policy in that state is scored the plain way instead: each row's prompt and
completion as one sequence, rows of similar length right-padded together (`whole_rows`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

# Completion rows per pass (after the shared prompt pass). Measured on the toy study's MEF model,
# 64 rollouts of one RL step, forward and backward on one thread: see docs/training.md.
ROWS_PER_PASS = 8


def completion_logprobs(
    model: Any,
    prompts: list[list[int]],
    completions: list[list[int]],
    pad: int,
    with_entropy: bool = False,
    rows_per_pass: int = ROWS_PER_PASS,
    temperature: float = 1.0,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Per-token log p of each completion given its prompt, in the rows' own order, under
    softmax(logits / temperature): the distribution the rollouts were sampled from (the RL update
    passes rl.temperature, so the ratio, the KL and the entropy are those of the sampling policy).

    Returns logp (N, T), mask (N, T) and, if asked, the entropy of each predicted token's
    distribution (N, T); T = the longest completion, zeros past each row's end. Completions must
    not be empty (the loop scores an empty one as its end-of-turn token)."""
    from transformers import DynamicCache

    n = len(prompts)
    if any(not c for c in completions):
        raise ValueError("completion_logprobs: every completion needs at least one token")
    t_max = max(len(c) for c in completions)
    device = next(model.parameters()).device
    if temperature <= 0:
        raise ValueError(f"completion_logprobs: temperature must be positive, got {temperature}")
    if scores_whole_rows(model):
        return whole_rows(model, prompts, completions, pad, with_entropy, rows_per_pass, temperature)

    # 1. the distinct prompts, right-padded, once
    distinct: dict[tuple[int, ...], int] = {}
    which = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]  # row -> its prompt
    unique = list(distinct)
    lengths = torch.tensor([len(p) for p in unique])
    width = int(lengths.max())
    ids = torch.full((len(unique), width), pad, dtype=torch.long)
    seen = torch.zeros((len(unique), width), dtype=torch.long)
    for i, p in enumerate(unique):
        ids[i, : len(p)] = torch.tensor(p)
        seen[i, : len(p)] = 1
    ids, seen, lengths = ids.to(device), seen.to(device), lengths.to(device)
    out = model.get_decoder()(input_ids=ids, attention_mask=seen, use_cache=True)
    last = out.last_hidden_state[torch.arange(len(unique), device=device), lengths - 1]  # (P, hidden)
    first_logits = model.get_output_embeddings()(last).float() / temperature  # (P, V): completion token 0
    cache = [(layer.keys, layer.values) for layer in out.past_key_values.layers]  # (P, Hkv, W, D) each

    rows_of = torch.tensor(which, device=device)
    first_log_probs = torch.log_softmax(first_logits, dim=-1)[rows_of]  # (N, V)
    first_tokens = torch.tensor([c[0] for c in completions], device=device)
    first_logp = first_log_probs.gather(1, first_tokens[:, None])  # (N, 1)
    first_entropy = _entropy(first_log_probs).unsqueeze(-1) if with_entropy else None

    # 2. the rest of each completion, rows of similar length together
    order = sorted(range(n), key=lambda row: len(completions[row]))
    rest_logp: list[Tensor] = []
    rest_entropy: list[Tensor] = []
    for start in range(0, n, rows_per_pass):
        rows = order[start : start + rows_per_pass]
        t_pass = max(len(completions[r]) for r in rows) - 1  # tokens fed: each completion minus its last
        if t_pass == 0:  # one-token completions only: all scored by the prompt pass
            rest_logp.append(torch.zeros((len(rows), t_max - 1), device=device))
            rest_entropy.append(torch.zeros((len(rows), t_max - 1), device=device))
            continue
        index = rows_of[rows]
        past = DynamicCache(ddp_cache_data=[(k.index_select(0, index), v.index_select(0, index)) for k, v in cache])
        fed = torch.full((len(rows), t_pass), pad, dtype=torch.long)
        targets = torch.zeros((len(rows), t_pass), dtype=torch.long)
        valid = torch.zeros((len(rows), t_pass), dtype=torch.long)
        for i, r in enumerate(rows):
            c = completions[r]
            fed[i, : len(c) - 1] = torch.tensor(c[:-1])
            targets[i, : len(c) - 1] = torch.tensor(c[1:])
            valid[i, : len(c) - 1] = 1
        fed, targets, valid = fed.to(device), targets.to(device), valid.to(device)
        logits = (
            model(
                input_ids=fed,
                attention_mask=torch.cat([seen[index], valid], dim=1),  # own prompt, then own tokens
                position_ids=lengths[index][:, None] + torch.arange(t_pass, device=device),
                past_key_values=past,
                cache_position=torch.arange(width, width + t_pass, device=device),
                use_cache=True,
            ).logits.float()
            / temperature
        )  # (r, t_pass, V)
        log_probs = torch.log_softmax(logits, dim=-1)
        fill = (0, t_max - 1 - t_pass)
        picked = log_probs.gather(-1, targets[..., None]).squeeze(-1) * valid
        rest_logp.append(torch.nn.functional.pad(picked, fill))
        if with_entropy:
            spread = _entropy(log_probs) * valid
            rest_entropy.append(torch.nn.functional.pad(spread, fill))

    back = torch.empty(n, dtype=torch.long)  # the position of each row in the sorted order
    back[torch.tensor(order)] = torch.arange(n)
    back = back.to(device)
    logp = torch.cat([first_logp, torch.cat(rest_logp)[back]], dim=1)
    entropy = None
    if with_entropy:
        assert first_entropy is not None
        entropy = torch.cat([first_entropy, torch.cat(rest_entropy)[back]], dim=1)
    mask = torch.zeros((n, t_max), dtype=torch.bool)
    for row, c in enumerate(completions):
        mask[row, : len(c)] = True
    return logp, mask.to(device), entropy


def scores_whole_rows(model: Any) -> bool:
    """Whether completion_logprobs scores this model's rows whole (`whole_rows`): a policy in
    training mode under gradient checkpointing, whose layers drop the prompt pass's cache."""
    return bool(model.training and getattr(model, "is_gradient_checkpointing", False))


def _entropy(log_probs: Tensor) -> Tensor:
    """The entropy of each distribution over the last axis. A logged metric that no loss uses, so
    it is computed without a graph: autograd neither records its (rows, tokens, V) products nor
    keeps them for the backward pass."""
    with torch.no_grad():
        return -(log_probs.exp() * log_probs).sum(-1)


def whole_rows(
    model: Any,
    prompts: list[list[int]],
    completions: list[list[int]],
    pad: int,
    with_entropy: bool = False,
    rows_per_pass: int = ROWS_PER_PASS,
    temperature: float = 1.0,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The same values without a shared prompt pass: each row is prompt + completion, rows sorted by
    length and right-padded `rows_per_pass` at a time. The output layer runs only on the hidden
    states that predict a completion token (completion token j of a row is predicted at position
    len(prompt) + j - 1), gathered to the pass's own longest completion: a pass holds (rows,
    t_pass, V) logits, not (rows, t_max, V) nor (rows, width, V)."""
    n, t_max = len(prompts), max(len(c) for c in completions)
    device = next(model.parameters()).device
    order = sorted(range(n), key=lambda row: len(prompts[row]) + len(completions[row]))
    logps: list[Tensor] = []
    entropies: list[Tensor] = []
    for start in range(0, n, rows_per_pass):
        rows = order[start : start + rows_per_pass]
        width = max(len(prompts[r]) + len(completions[r]) for r in rows)
        t_pass = max(len(completions[r]) for r in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        seen = torch.zeros((len(rows), width), dtype=torch.long)
        index = torch.zeros((len(rows), t_pass), dtype=torch.long)  # the position predicting token j
        targets = torch.zeros((len(rows), t_pass), dtype=torch.long)
        valid = torch.zeros((len(rows), t_pass), dtype=torch.bool)
        for i, r in enumerate(rows):
            p, c = prompts[r], completions[r]
            ids[i, : len(p) + len(c)] = torch.tensor(p + c)
            seen[i, : len(p) + len(c)] = 1
            index[i, : len(c)] = torch.arange(len(p) - 1, len(p) - 1 + len(c))
            targets[i, : len(c)] = torch.tensor(c)
            valid[i, : len(c)] = True
        ids, seen, index, targets, valid = (x.to(device) for x in (ids, seen, index, targets, valid))
        hidden = model.get_decoder()(input_ids=ids, attention_mask=seen).last_hidden_state  # (r, width, H)
        wanted = hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1]))  # (r, t_pass, H)
        logits = model.get_output_embeddings()(wanted).float() / temperature  # (r, t_pass, V)
        log_probs = torch.log_softmax(logits, dim=-1)
        fill = (0, t_max - t_pass)
        logps.append(torch.nn.functional.pad(log_probs.gather(-1, targets[..., None]).squeeze(-1) * valid, fill))
        if with_entropy:
            entropies.append(torch.nn.functional.pad(_entropy(log_probs) * valid, fill))
    back = torch.empty(n, dtype=torch.long)
    back[torch.tensor(order)] = torch.arange(n)
    back = back.to(device)
    mask = torch.zeros((n, t_max), dtype=torch.bool)
    for row, c in enumerate(completions):
        mask[row, : len(c)] = True
    entropy = torch.cat(entropies)[back] if with_entropy else None
    return torch.cat(logps)[back], mask.to(device), entropy


def padded_tokens(
    prompts: list[list[int]], completions: list[list[int]], whole: bool, rows_per_pass: int = ROWS_PER_PASS
) -> int:
    """The positions the decoder runs when completion_logprobs scores these rows, padding included:
    what one micro-batch's activations are made of. `whole`: the rows scored whole (scores_whole_rows:
    under gradient checkpointing, the GPU default), each pass of `rows_per_pass` rows sorted by
    prompt + completion and padded to its longest; else the distinct prompts once, padded to the
    longest of them, then passes of rows sorted by completion, each padded to its longest completion
    minus the token the prompt pass predicts. A group of eight rollouts with one at a 2,048-token cap
    and seven short ones, scored whole, is 8 x (prompt + 2,048) positions, not the sum of its rows."""

    def passes(lengths: list[int]) -> int:
        ordered = sorted(lengths)
        chunks = [ordered[i : i + rows_per_pass] for i in range(0, len(ordered), rows_per_pass)]
        return sum(len(chunk) * chunk[-1] for chunk in chunks)  # each pass padded to its longest

    if whole:
        return passes([len(p) + len(c) for p, c in zip(prompts, completions, strict=True)])
    distinct = {tuple(p) for p in prompts}
    return len(distinct) * max(len(p) for p in distinct) + passes([len(c) - 1 for c in completions])


def micro_batches(
    prompts: list[list[int]], completions: list[list[int]], token_budget: int, whole: bool = False
) -> list[list[int]]:
    """The rows of one update cut into micro-batches of at most `token_budget` padded tokens (the
    positions their scoring passes run, padding included: padded_tokens, with `whole` as the model
    is scored: scores_whole_rows), in a fixed order. The update scores and back-propagates one
    micro-batch at a time, so what autograd keeps is one micro-batch's, not the batch's
    (rl.micro_batch_tokens). Counting each row's own tokens instead would let one capped rollout
    among seven short ones through as a small micro-batch that the pass pads to 8 x the cap.

    Rows that share a prompt stay together (completion_logprobs then runs that prompt once); groups
    are taken in order of their longest completion, so rows of similar length share a micro-batch
    and one long rollout does not widen the others' passes. A group over the budget is split, its rows
    in order of length, and a single row over it is a micro-batch of its own."""
    if token_budget < 1:
        raise ValueError(f"micro_batches: token_budget must be positive, got {token_budget}")
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for row, p in enumerate(prompts):
        by_prompt.setdefault(tuple(p), []).append(row)
    groups = sorted(by_prompt.values(), key=lambda rows: (max(len(completions[r]) for r in rows), rows[0]))

    def cost(rows: list[int]) -> int:
        return padded_tokens([prompts[r] for r in rows], [completions[r] for r in rows], whole)

    batches: list[list[int]] = []
    current: list[int] = []
    for rows in groups:
        if current and cost(current + rows) > token_budget:
            batches.append(current)
            current = []
        # a group over the budget is split, its short rows together
        for row in sorted(rows, key=lambda r: len(completions[r])):
            if current and cost([*current, row]) > token_budget:
                batches.append(current)
                current = []
            current.append(row)
    if current:
        batches.append(current)
    return batches
