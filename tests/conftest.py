"""Shared test helpers. Tests never touch the network or a model hub."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

PROJECT = Path(__file__).resolve().parents[1]
SHARED_DATASETS = PROJECT.parent / "shared" / "datasets"
# config/paper.yaml pins GSM8K's hub commit but not StrategyQA's or MathQA's (none could be looked up
# here), so its dry run refuses until they are set; the tests that list its jobs lay this over it.
PAPER_DATA_PINS = PROJECT / "tests" / "paper-data-pins.yaml"


@pytest.fixture(scope="session")
def shared_datasets() -> Path:
    if not (SHARED_DATASETS / "gsm8k" / "test.jsonl").is_file():
        pytest.skip(f"real data sets not present at {SHARED_DATASETS} (they are only for checking, never committed)")
    return SHARED_DATASETS


@pytest.fixture(scope="session")
def small_world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small toy world shared by the tests that only read it."""
    from meml.data.toy.world import build_world

    root = tmp_path_factory.mktemp("world")
    build_world(root, seed=0, sizes={"gsm8k": (60, 20), "strategyqa": (60, 20), "mathqa": (60, 20)})
    return root
