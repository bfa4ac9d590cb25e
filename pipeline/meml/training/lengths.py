"""Do the length caps fit the trajectories? Checked before RL, with the run's own tokenizer.

An expert's SFT trajectories teach it how long its answers are. When many of them are longer than
rl.max_new_tokens, that expert's rollouts are cut before their answer line, score 0, and the
expert looks hopeless to GRPO, IML and HSFT for a reason that is only a setting: the paper config
once had teachers writing up to 8192 tokens, SFT keeping 4096 and RL stopping at 1024, which cuts
the R1-style headline expert most. So RL refuses to start while more than rl.max_truncated_share
of an RL expert's trajectories do not fit, and names the keys that set the caps. In the real world
the same check runs as a job of its own right after the teachers, before SFT (check_before_sft), so
that a cap that does not fit is found before SFT is paid for; RL still checks when it starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from meml.core.io import DataError
from meml.core.records import Record, read_records
from meml.core.stops import stop_tokens, target_ids
from meml.data.experts import read_trajectories


def over_cap_shares(
    tokenizer: Any, experts_dir: str | Path, experts: list[int], by_id: dict[str, Record], max_new_tokens: int
) -> dict[str, float]:
    """{"e<k>": share of expert k's trajectories whose turn (with its end-of-turn token) is longer
    than max_new_tokens}, for the experts that have a trajectory file."""
    stops = stop_tokens(tokenizer)
    shares = {}
    for k in experts:
        path = Path(experts_dir) / f"e{k}.jsonl"
        if not path.is_file():
            continue
        lengths = [len(target_ids(tokenizer, text, stops)) for _, _, text in read_trajectories(path, by_id)]
        if lengths:
            shares[f"e{k}"] = sum(n > max_new_tokens for n in lengths) / len(lengths)
    return shares


def check_fits(shares: dict[str, float], max_new_tokens: int, max_share: float, experts_dir: str | Path) -> None:
    for expert, share in shares.items():
        if share > max_share:
            raise DataError(
                f"{share:.0%} of expert {expert[1:]}'s SFT trajectories are longer than rl.max_new_tokens = "
                f"{max_new_tokens} tokens (allowed: rl.max_truncated_share = {max_share:.0%}): its rollouts would "
                "be cut before their answer. Raise rl.max_new_tokens (and eval.max_new_tokens), or shorten the "
                "trajectories (teachers.e<k>.max_tokens, sft.max_length; toy: the generator)",
                Path(experts_dir) / f"{expert}.jsonl",
                None,
                "rl.max_new_tokens",
            )


def check_before_sft(
    model: str | Path, data: str | Path, experts_dir: str | Path, checks: list[dict[str, Any]], sft_done: bool = False
) -> dict[str, Any]:
    """RL's check, run right after the teachers and before SFT (the rule trajectory_lengths), on the
    base model's tokenizer, which SFT hands on to RL unchanged. `checks`: the RL cells' caps of this
    model and data set, each {experts, max_new_tokens, max_truncated_share} (plan/teacher_stage.py,
    checks_before_sft). Raises check_fits's error for the first that fails, unless `sft_done` (an SFT
    run of this model and data set has finished, on an earlier cap): SFT is paid for then, and RL
    refuses its cells with the same message when they start, so the result records the error
    (`error`) and the job succeeds: its output stays, and a cap set right again reruns no SFT."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    by_id = {r.id: r for r in read_records(Path(data) / "train.jsonl")}
    out: dict[str, Any] = {"tokenizer": str(model), "checks": []}
    for check in checks:
        cap = int(check["max_new_tokens"])
        shares = over_cap_shares(tokenizer, experts_dir, list(check["experts"]), by_id, cap)
        out["checks"].append({**check, "over_cap": shares})
        try:
            check_fits(shares, cap, float(check["max_truncated_share"]), experts_dir)
        except DataError as err:
            if not sft_done:
                raise
            out.setdefault("error", str(err))
    return out
