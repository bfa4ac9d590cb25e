"""The environment record in every run's DONE: what the numbers depend on besides the config."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from meml.core import environment


def test_weights_hash_by_hand(tmp_path: Path) -> None:
    # the weight files in name order, each as its name, a NUL and its bytes; other files ignored
    (tmp_path / "b.bin").write_bytes(b"z")
    (tmp_path / "a.safetensors").write_bytes(b"xy")
    (tmp_path / "config.json").write_text("{}")
    expected = hashlib.sha256(b"a.safetensors\0xy" + b"b.bin\0z").hexdigest()
    assert environment.weights_sha256(tmp_path) == expected
    moved = tmp_path / "elsewhere"  # the same weights in another folder: the same hash
    moved.mkdir()
    (moved / "a.safetensors").write_bytes(b"xy")
    (moved / "b.bin").write_bytes(b"z")
    assert environment.weights_sha256(moved) == expected
    (moved / "b.bin").write_bytes(b"Z")
    assert environment.weights_sha256(moved) != expected


def test_a_folder_without_weights_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        environment.weights_sha256(tmp_path)


def test_the_record_names_machine_threads_versions_and_weights(tmp_path: Path) -> None:
    import transformers

    (tmp_path / "model.safetensors").write_bytes(b"w")
    env = environment.environment_record(tmp_path)
    assert env["cpu"] and env["cpu"] != "unknown"
    assert env["threads"] == torch.get_num_threads()
    assert (env["torch"], env["transformers"]) == (torch.__version__, transformers.__version__)
    assert env["start_weights_sha256"] == hashlib.sha256(b"model.safetensors\0w").hexdigest()
    assert env["device"] == "cpu" and "gpu" not in env
