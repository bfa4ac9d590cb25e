"""A hub model at a pinned commit, downloaded once into the results (rule `hub_model`).

    models.<m>: {source: Qwen/Qwen2.5-Math-1.5B, revision: <the hub commit, 40 hex digits>}

A hub repository's `main` moves: weights, tokenizer files and chat templates are replaced in place.
A model named by its id alone is whatever the hub holds on the day a job starts, and two jobs of one
grid may start from different models. So a pinned model is downloaded once, at its commit, into
`results/<profile>/models/hub/<owner>--<name>@<commit[:12]>/`, and every stage starts from that
folder; `HUB.json` in it says which repository and commit it holds. A real run refuses, before its
first job, a hub model or data set without a commit (plan/preflight.py); `meml pin` prints the
current commits to paste (`current_commits`).

Every failure is one `DataError` line that names the key: a revision that is not a commit, a
repository or commit the hub does not have, a gated model without an accepted licence and token.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meml.core.io import DataError, atomic_write_json

COMMIT = re.compile(r"^[0-9a-f]{40}$")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_hub_id(source: str) -> bool:
    """A source that names a hub repository (owner/name), not a tiny model, a GGUF file or a folder here."""
    return bool(HUB_ID.match(source)) and not Path(source).is_dir() and ":" not in source


def folder_name(source: str, revision: str) -> str:
    """The folder below results/<profile>/models/ of `source` at `revision`."""
    return f"hub/{source.replace('/', '--')}@{revision[:12]}"


def check_commit(revision: Any, key: str) -> str:
    if not isinstance(revision, str) or not COMMIT.match(revision):
        raise DataError(
            f"'{revision}' is not a hub commit (40 hex digits); `python -m meml.cli pin --config <config>` prints the "
            "current ones",
            None,
            None,
            key,
        )
    return revision


def download(
    source: str, revision: str, out: str | Path, key: str = "models", snapshot: Callable[..., Any] | None = None
) -> Path:
    """`source` at `revision` into the folder `out`, written whole or not at all (a sibling temporary
    folder renamed into place). `snapshot`: huggingface_hub.snapshot_download, injectable for tests."""
    check_commit(revision, f"{key}.revision")
    out = Path(out)
    if (out / "HUB.json").is_file():
        return out
    if snapshot is None:
        from huggingface_hub import snapshot_download

        snapshot = snapshot_download
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        try:
            # the weights, config, tokenizer and templates; not the original/ checkpoints or other formats
            snapshot(repo_id=source, revision=revision, local_dir=str(work),
                     allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"],
                     ignore_patterns=["original/*"])  # fmt: skip
        except Exception as err:  # the hub's errors: not found, gated, a revision it does not have
            raise DataError(f"{source}@{revision[:12]}: {type(err).__name__}: {err}", None, None, key) from None
        if not (work / "config.json").is_file():
            raise DataError(f"{source}@{revision[:12]}: the download has no config.json", None, None, key)
        shutil.rmtree(work / ".cache", ignore_errors=True)  # huggingface_hub's own bookkeeping
        atomic_write_json(work / "HUB.json", {"source": source, "revision": revision})
        if out.exists():
            shutil.rmtree(out)  # an earlier download cut short: it has no HUB.json
        work.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def current_commits(cfg: dict[str, Any], api: Any = None) -> list[str]:
    """`key: commit` lines for every hub model and hub data set of the grid without a commit: the
    hub's current commit of its branch (data sets: `hub_revision`'s branch, else main). Needs the
    network; `api`: a huggingface_hub.HfApi, injectable for tests."""
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi()
    lines = []
    for name in cfg["grid"].get("models") or list(cfg["models"]):
        entry = cfg["models"][name]
        if is_hub_id(str(entry["source"])) and not COMMIT.match(str(entry.get("revision") or "")):
            sha = api.model_info(str(entry["source"])).sha
            lines.append(f"models.{name}.revision: {sha}   # {entry['source']}, main today")
    for ds in cfg["grid"]["datasets"]:
        entry = cfg["data"].get(ds) or {}
        branch = entry.get("hub_revision")
        if entry.get("local") or COMMIT.match(str(branch or "")):
            continue
        sha = api.dataset_info(str(entry["hub_id"]), revision=branch).sha
        lines.append(f"data.{ds}.hub_revision: {sha}   # {entry['hub_id']}, {branch or 'main'} today")
    return lines
