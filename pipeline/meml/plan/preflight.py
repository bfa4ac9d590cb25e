"""What a real-world run will need, checked before it starts (and on a dry run): the teachers'
API keys or trajectory files, the data sets' local folders or the hub, the models' local copies or
the hub, and the GPUs. Each line says what is there and what is missing; nothing is fetched.

    lines = needs(cfg)     # one line a requirement, "ok:" or "MISSING:" first

The Snakefile prints these, then the grid's GPU-hours with both rollout engines, before the jobs
and again after them (a dry run lists hundreds of jobs in between).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from meml.data.gguf_models import is_gguf


def _teachers(cfg: dict[str, Any]) -> list[str]:
    out = []
    for name in sorted(cfg.get("teachers") or {}):
        t = cfg["teachers"][name]
        where = f"teachers.{name}"
        if t.get("backend") == "openai":
            if t.get("standin"):
                out.append(f"ok: {where}: the local stand-in server (no key needed)")
            elif t.get("api_key_env") and not os.environ.get(t["api_key_env"]):
                out.append(f"MISSING: {where}: the API key's environment variable {t['api_key_env']} is not set")
            else:
                out.append(f"ok: {where}: {t.get('model')} at {t.get('base_url')} (the network must reach it)")
        elif t.get("backend") == "jsonl":
            path = Path(str(t.get("path")))
            state = "there" if path.exists() else "not there yet (your files, or a rule of this workflow, write it)"
            out.append(f"{'ok' if path.exists() else 'note'}: {where}: trajectories from {path}: {state}")
        elif t.get("backend") == "vllm":
            out.append(f"note: {where}: {t.get('model')} through vLLM on this machine (a GPU, and the hub or a folder)")
    return out


def _hub_cached(repo: str) -> bool:
    try:
        from huggingface_hub import scan_cache_dir

        return any(r.repo_id == repo for r in scan_cache_dir().repos)
    except Exception:  # no cache folder yet
        return False


def _data(cfg: dict[str, Any]) -> list[str]:
    out = []
    offline = os.environ.get("HF_HUB_OFFLINE") == "1"
    for ds in cfg["grid"]["datasets"]:
        entry = cfg["data"].get(ds) or {}
        if entry.get("local"):
            found = Path(entry["local"]).is_dir()
            out.append(f"{'ok' if found else 'MISSING'}: data.{ds}.local: {entry['local']}"
                       + ("" if found else " is not a folder"))  # fmt: skip
        else:
            hub = str(entry.get("hub_id"))
            state = "in the local cache" if _hub_cached(hub) else "from the hub (network needed)"
            bad = offline and not _hub_cached(hub)
            out.append(f"{'MISSING' if bad else 'ok'}: data.{ds}: {hub} {state}"
                       + (", but HF_HUB_OFFLINE=1" if bad else ""))  # fmt: skip
    return out


def _models(cfg: dict[str, Any]) -> list[str]:
    out = []
    offline = os.environ.get("HF_HUB_OFFLINE") == "1"
    for name in cfg["grid"].get("models") or list(cfg["models"]):
        source = str(cfg["models"][name]["source"])
        if source.startswith("tiny:"):
            continue
        if is_gguf(source):
            out.append(f"ok: models.{name}: {source} (a PyPI wheel's file, fetched by pip)")
        elif Path(source).is_dir():
            out.append(f"ok: models.{name}: the folder {source}")
        else:
            cached = _hub_cached(source)
            bad = offline and not cached
            pinned = f" at {cfg['models'][name]['revision'][:12]}" if cfg["models"][name].get("revision") else ""
            out.append(f"{'MISSING' if bad else 'ok'}: models.{name}: {source}{pinned} "
                       + ("in the local cache" if cached else "from the hub (network needed)")
                       + (", but HF_HUB_OFFLINE=1" if bad else ""))  # fmt: skip
    return out


def _gpus(cfg: dict[str, Any]) -> list[str]:
    if cfg["device"] != "cuda":
        return []
    import torch

    from meml.core import cuda_check

    want = int(cfg["launch"]["processes"])
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    driver = cuda_check.driver_version()  # None: no GPU here (a login node), nothing more to check
    unusable = [] if driver is None else cuda_check.problems(
        torch.__version__, torch.version.cuda, driver, torch.cuda.is_available())  # fmt: skip
    if have >= want:
        count = f"ok: device cuda: {have} GPU(s) here, {want} a job"
    else:
        count = f"MISSING: device cuda: {have} GPU(s) here, {want} a job (a cluster profile gives jobs their own)"
    return [count, *(f"MISSING: device cuda: {problem}" for problem in unusable)]


def update_memory(cfg: dict[str, Any]) -> tuple[list[str], list[str]]:
    """A cuda config's RL update (its worst micro-batch) and SFT memory per model: (lines,
    refusals). Measured on the meta device (training/memory.py): torch's import and a few seconds,
    once per invocation of the workflow's main process."""
    if cfg["device"] != "cuda":
        return [], []
    from meml.training.memory import config_lines

    return config_lines(cfg)


def _has_hub_token() -> bool:
    """A hub token is there (HF_TOKEN, or the token file `huggingface-cli login` writes): its
    presence only, checked offline; whether the hub accepts it is the first download's to say."""
    if os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN"):
        return True
    try:
        from huggingface_hub import get_token

        return bool(get_token())
    except Exception:  # an old or absent huggingface_hub: no token file read
        return False


def refusals(cfg: dict[str, Any]) -> list[str]:
    """What stops a real-world or GPU run before its first job (the dry run too), one line each,
    naming the key: the things that would otherwise fail after money is spent."""
    if cfg["world"] != "real" and cfg["device"] != "cuda":
        return []
    from meml.core.config import dataset_rl

    out = []
    datasets = cfg["grid"]["datasets"]
    cap, capped = min((int(dataset_rl(cfg, ds)["max_new_tokens"]), ds) for ds in datasets)
    share = dataset_rl(cfg, capped)["max_truncated_share"]
    for name in sorted(cfg.get("teachers") or {}):
        t = cfg["teachers"][name]
        paid = t.get("backend") in ("openai", "vllm") and not t.get("standin")  # a stand-in costs nothing
        if paid and float(share) < 1.0 and int(t.get("max_tokens") or 0) > cap:
            out.append(
                f"teachers.{name}.max_tokens {t['max_tokens']} is above RL's answer cap of {cap} tokens "
                f"(rl_by_dataset.{capped}.max_new_tokens): RL refuses to start when more than {share} of an "
                f"expert's trajectories are longer (rl.max_truncated_share), after the API calls and SFT are paid "
                f"for; set teachers.{name}.max_tokens to {cap} or less"
            )
    out += _unpinned(cfg)
    for name in cfg["grid"].get("models") or list(cfg["models"]):
        entry = cfg["models"][name]
        source = str(entry["source"])
        if entry.get("gated") and not Path(source).is_dir() and not _has_hub_token():
            out.append(
                f"models.{name}: {source} is gated on the hub and no hub token is set (HF_TOKEN, or "
                "`huggingface-cli login`); accept its licence on the hub and set one before the first job"
            )
    return out


def _unpinned(cfg: dict[str, Any]) -> list[str]:
    """A hub model or data set named without a commit: what its jobs load depends on the day each
    starts (data/hub_models.py)."""
    from meml.data.hub_models import COMMIT, is_hub_id

    fix = "`python -m meml.cli pin --config <this config>` prints the hub's current commits"
    out = []
    for name in cfg["grid"].get("models") or list(cfg["models"]):
        entry = cfg["models"][name]
        if is_hub_id(str(entry["source"])) and not COMMIT.match(str(entry.get("revision") or "")):
            out.append(f"models.{name}.revision: {entry['source']} is not pinned to a hub commit; {fix}")
    for ds in cfg["grid"]["datasets"]:
        entry = cfg["data"].get(ds) or {}
        if not entry.get("local") and not COMMIT.match(str(entry.get("hub_revision") or "")):
            branch = entry.get("hub_revision") or "main"
            out.append(
                f"data.{ds}.hub_revision: {entry.get('hub_id')} is not pinned to a commit ({branch} moves); {fix}"
            )
    return out


def seeds_line(cfg: dict[str, Any]) -> list[str]:
    """Said plainly when the grid has too few seeds for any verdict (report.stats.min_seeds)."""
    seeds, needed = len(cfg["grid"]["seeds"]), int(cfg["report"]["stats"]["min_seeds"])
    if seeds >= needed:
        return []
    return [
        f"note: grid.seeds has {seeds} seed(s): the report will give no verdict (report.stats.min_seeds {needed}); "
        f"{needed} seeds cost {needed / seeds:.0f}x the training and evaluation GPU-hours below"
    ]


def needs(cfg: dict[str, Any]) -> list[str]:
    """One line a requirement of a real-world or GPU run; none for the toy world on a CPU."""
    if cfg["world"] != "real" and cfg["device"] != "cuda":
        return []
    return [*_teachers(cfg), *_data(cfg), *_models(cfg), *_gpus(cfg), *seeds_line(cfg)]


def block(cfg: dict[str, Any], estimate: list[str]) -> str:
    """What the Snakefile prints: the needs, then the estimate lines."""
    lines = needs(cfg)
    missing = sum(line.startswith("MISSING") for line in lines)
    head = f"Before this run ({missing} missing):" if missing else "Before this run:"
    return "\n".join([head, *(f"  {line}" for line in lines), *estimate])
