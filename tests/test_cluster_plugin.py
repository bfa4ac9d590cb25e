"""The SLURM plugin's status query, made to see `CANCELLED by <uid>` as CANCELLED (meml/cluster.py)."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from meml.cluster import normalize_states, patch_slurm_plugin


def test_a_cancelled_state_keeps_its_first_word() -> None:
    states = {"164": "CANCELLED by 0", "165": "COMPLETED", "166": "RUNNING", "167": ""}
    assert normalize_states(states) == {"164": "CANCELLED", "165": "COMPLETED", "166": "RUNNING", "167": ""}
    assert normalize_states(None) is None


@pytest.mark.skipif(importlib.util.find_spec("snakemake_executor_plugin_slurm") is None, reason="no SLURM plugin")
def test_the_plugin_sees_a_cancelled_job_as_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    import snakemake_executor_plugin_slurm as plugin

    async def sacct(command: str, logger: object) -> tuple[dict[str, str], float]:
        return {"164": "CANCELLED by 0", "165": "RUNNING"}, 0.01

    monkeypatch.setattr(plugin, "query_job_status", sacct)
    assert patch_slurm_plugin() and patch_slurm_plugin()  # twice: wrapped once
    states, _ = asyncio.run(plugin.query_job_status("sacct ...", None))
    assert states == {"164": "CANCELLED", "165": "RUNNING"}
    assert states["164"] in ("BOOT_FAIL", "CANCELLED", "DEADLINE", "FAILED")  # what the plugin fails on
    assert plugin.query_job_status.__wrapped__ is sacct  # type: ignore[attr-defined]
