"""Expert complementarity, the paper's motivating figure: do the experts fail on different questions?

After MEF, each expert samples k answers per question (temperature from the config). Sample j of
every expert forms draw j; per draw, a question is "wrong" for an expert when its j-th answer is.
Averaged over questions and draws:
    error_rate[e]                the share of expert e's answers that are wrong
    all_wrong                    the share of (question, draw) where every expert is wrong
    all_wrong_among_wrong        all_wrong / the share where at least one expert is wrong
    solved_by_another[e]         among expert e's wrong answers, the share that another expert
                                 answers correctly in the same draw
    at_least_one_correct         the share where some expert is right
    patterns                     the share of each failure pattern (which experts are wrong)
Also pass@k per expert and for the pooled experts (a question solved in any of the k draws).

Sampling goes in chunks of `batch_size` questions, each seeded by (seed, expert, chunk) and saved to
`<out>.work/` as it ends: a killed or preempted analysis resumes at the first chunk not saved, and
ends with the numbers of an uninterrupted one. Chunks made under other settings are never reused.
The samples are drawn on the job's device through the engine rl.engine names there
(engines.sampling_job_engine): vLLM on a GPU, the kv engine on a CPU.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from meml.core.answers import is_correct
from meml.core.environment import weights_sha256
from meml.core.io import DataError, atomic_write_json, read_json
from meml.core.precision import Precision, resolve
from meml.core.records import read_records
from meml.data.experts import DEFAULT_PROMPTS, chat_messages
from meml.training.engines import close_engine, sampling_job_engine, sampling_job_engine_name
from meml.training.rollout import Sampling, prompt_ids
from meml.training.rollout_vllm import VLLMSettings


def sample_correctness(
    model_dir: str | Path | Sequence[str | Path],
    data_file: str | Path,
    experts: Sequence[int],
    k: int,
    sampling: Sampling,
    *,
    prompts: Sequence[str] = DEFAULT_PROMPTS,
    limit: int | None = None,
    seed: int = 0,
    batch_size: int = 64,
    mode: str = "lenient",
    work: str | Path | None = None,
    precision: Precision | None = None,
    engine_name: str = "kv",
    vllm: VLLMSettings | None = None,
) -> torch.Tensor:
    """correct[q, e, j]: whether expert e's j-th sample on question q is right. Shape (Q, E, k).
    `model_dir`: the MEF model, sampled under each expert's prompt (the default reading), or one
    model per expert (the paper figure's reading: three separately fine-tuned models). `work`: the
    folder where each chunk's answers are kept until the analysis ends (None: kept nowhere).
    `precision`: the job's device and dtype (default the CPU in fp32); `engine_name`: rl.engine."""
    from transformers import AutoTokenizer

    precision = precision or resolve("cpu")
    engine_used = sampling_job_engine_name(precision.device, engine_name)

    records = read_records(data_file)[: limit or None]
    for e in experts:
        if not 0 <= e < len(prompts):
            raise DataError(f"unknown expert {e}; this config has experts 0..{len(prompts) - 1}")
    models = [model_dir] * len(experts) if isinstance(model_dir, str | Path) else list(model_dir)
    if len(models) != len(experts):
        raise DataError(f"{len(models)} models for {len(experts)} experts: give one, or one per expert")
    correct = torch.zeros(len(records), len(experts), k, dtype=torch.bool)
    # the weights too: a retrained model in the same folder makes new chunks
    identity = {"models": [str(m) for m in models], "weights": [weights_sha256(m) for m in dict.fromkeys(models)],
                "data": str(data_file), "questions": [r.id for r in records],
                "k": k, "sampling": repr(sampling), "prompts": list(prompts), "seed": seed, "mode": mode,
                "batch_size": batch_size, "engine": engine_used, "dtype": precision.dtype}  # fmt: skip
    saved = saved_chunks(Path(work), identity) if work is not None else {}
    from tqdm import tqdm

    loaded: tuple[Any, Any, Any] | None = None
    chunks = range(0, len(records), batch_size)
    progress = tqdm(total=len(experts) * len(chunks), desc=f"sampling {k} per question and expert", unit="chunk")
    for i, e in enumerate(experts):
        for start in chunks:
            done = saved.get((e, start // batch_size))
            if done is not None:
                correct[start : start + batch_size, i] = done
                progress.update()
                continue
            if loaded is None or loaded[0] != models[i]:
                if loaded is not None:  # the previous model's engine gives its memory back first
                    close_engine(loaded[2])
                tokenizer = AutoTokenizer.from_pretrained(models[i])
                engine = sampling_job_engine(models[i], tokenizer, precision, engine_name, vllm, seed, batch_size)
                loaded = (models[i], tokenizer, engine)
            _, tokenizer, engine = loaded
            chunk = records[start : start + batch_size]
            torch.manual_seed(chunk_seed(seed, e, start // batch_size))  # a chunk's draws do not depend on the others
            outs = engine.generate([prompt_ids(tokenizer, chat_messages(r, e, prompts)) for r in chunk], k, sampling)
            for q, (record, samples) in enumerate(zip(chunk, outs, strict=True)):
                for j, c in enumerate(samples):
                    right = is_correct(c.text, record.dataset, record.answer, mode, record.options, c.finished)
                    correct[start + q, i, j] = right
            if work is not None:
                save_chunk(Path(work), identity, e, start // batch_size, correct[start : start + batch_size, i])
            progress.update()
    progress.close()
    if loaded is not None:
        close_engine(loaded[2])
    return correct


def chunk_seed(seed: int, expert: int, chunk: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}/{expert}/{chunk}".encode()).digest()[:4], "little")


def saved_chunks(work: Path, identity: dict[str, Any]) -> dict[tuple[int, int], torch.Tensor]:
    """The chunks a killed analysis saved under the same identity, by (expert, chunk); a folder
    made under other settings is emptied."""
    try:
        same = read_json(work / "identity.json") == identity
    except (OSError, ValueError, DataError):
        same = False
    if not same:
        shutil.rmtree(work, ignore_errors=True)
        atomic_write_json(work / "identity.json", identity)
        return {}
    found = {}
    for path in work.glob("e*-c*.json"):
        expert, chunk = (int(x[1:]) for x in path.stem.split("-"))
        found[(expert, chunk)] = torch.tensor(json.loads(path.read_text()), dtype=torch.bool)
    return found


def save_chunk(work: Path, identity: dict[str, Any], expert: int, chunk: int, correct: torch.Tensor) -> None:
    """One chunk's answers, correct[q, j] over its questions, written whole or not at all."""
    atomic_write_json(work / f"e{expert}-c{chunk}.json", correct.tolist())


def complementarity(correct: torch.Tensor, experts: Sequence[int]) -> dict[str, Any]:
    """The statistics above from correct[q, e, j]."""
    wrong = ~correct
    any_wrong = wrong.any(1)  # (Q, k)
    all_wrong = wrong.all(1)
    out: dict[str, Any] = {
        "questions": int(correct.shape[0]),
        "samples_per_expert": int(correct.shape[2]),
        "experts": [int(e) for e in experts],
        "error_rate": {f"e{e}": round(float(wrong[:, i].float().mean()), 4) for i, e in enumerate(experts)},
        "all_wrong": round(float(all_wrong.float().mean()), 4),
        "all_wrong_among_wrong": round(float(all_wrong.sum() / any_wrong.sum().clamp(min=1)), 4),
        "at_least_one_correct": round(float(correct.any(1).float().mean()), 4),
        "pass_at_k": {f"e{e}": round(float(correct[:, i].any(-1).float().mean()), 4) for i, e in enumerate(experts)},
        "pass_at_k_pooled": round(float(correct.any(-1).any(-1).float().mean()), 4),
    }
    solved: dict[str, float | None] = {}
    for i, e in enumerate(experts):
        others = [j for j in range(len(experts)) if j != i]
        mine = wrong[:, i]
        rescued = mine & correct[:, others].any(1) if others else torch.zeros_like(mine)
        solved[f"e{e}"] = round(float(rescued.sum() / mine.sum()), 4) if mine.any() else None
    out["solved_by_another"] = solved
    patterns = {}
    for bits in itertools.product([False, True], repeat=len(experts)):
        match = torch.ones_like(all_wrong)
        for i, b in enumerate(bits):
            match &= wrong[:, i] == b
        label = "+".join(f"e{e}" for e, b in zip(experts, bits, strict=True) if b) or "none"
        patterns[label] = round(float(match.float().mean()), 4)
    out["patterns"] = patterns  # which experts are wrong in a (question, draw)
    return out


def plot(stats: dict[str, Any], title: str, out_stem: str | Path) -> list[Path]:
    """Left: each expert's error rate beside 'all wrong' and 'at least one right'. Right: the share
    of each failure pattern, the overlap of the experts' error sets."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9.6, 3.6), gridspec_kw={"width_ratios": [1, 1.4]})
    names = list(stats["error_rate"])
    values = [stats["error_rate"][n] for n in names]
    labels = [f"expert {n[1:]}\nwrong" for n in names] + ["all\nwrong", "at least\none right"]
    bars = [*values, stats["all_wrong"], stats["at_least_one_correct"]]
    colors = [*["tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:olive"][: len(names)], "tab:red", "tab:gray"]
    left.bar(range(len(bars)), bars, color=colors)
    left.set_xticks(range(len(bars)), labels, fontsize=7)
    left.set_ylim(0, 1)
    left.set_ylabel("share of (question, sample)")
    for x, v in enumerate(bars):
        left.text(x, v + 0.02, f"{100 * v:.0f}%", ha="center", fontsize=7)
    patterns = {k: v for k, v in stats["patterns"].items() if k != "none"}
    order = sorted(patterns, key=lambda p: (p.count("+"), p))
    right.barh(
        range(len(order)),
        [patterns[p] for p in order],
        color=["tab:red" if p.count("+") == len(names) - 1 else "tab:blue" for p in order],
    )
    right.set_yticks(range(len(order)), [f"{p.replace('+', ' & ')} wrong" for p in order], fontsize=7)
    right.set_xlabel("share of (question, sample)")
    right.set_title("who is wrong together (red: every expert)", fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    paths = []
    for ext in ("png", "pdf"):
        path = Path(f"{out_stem}.{ext}")
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=150)
        paths.append(path)
    plt.close(fig)
    return paths


def run(
    model_dir: str | Path | Sequence[str | Path],
    data_file: str | Path,
    experts: Sequence[int],
    k: int,
    sampling: Sampling,
    out_stem: str | Path,
    title: str,
    **kwargs: Any,
) -> dict[str, Any]:
    work = Path(f"{out_stem}.work")
    correct = sample_correctness(model_dir, data_file, experts, k, sampling, work=work, **kwargs)
    stats = complementarity(correct, experts)
    plot(stats, title, out_stem)
    atomic_write_json(f"{out_stem}.json", stats)  # last: the rule's output says the figures are there too
    shutil.rmtree(work, ignore_errors=True)
    return stats
