"""The SLURM plugin's status query, made to see `CANCELLED by <uid>` as CANCELLED (meml/cluster.py), and
the cluster profile as the plugin reads it."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest
import yaml
from conftest import PROJECT

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


@pytest.mark.skipif(importlib.util.find_spec("snakemake_executor_plugin_slurm") is None, reason="no SLURM plugin")
def test_the_cluster_profile_requeues_through_the_plugins_own_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """profiles/slurm asks SLURM to requeue a job whose node fails through the plugin's `requeue`
    setting, read here by Snakemake's own parser and the plugin's settings as a run would read them:
    the plugin then leaves a NODE_FAIL to SLURM rather than failing the job, so no retry runs the cell
    beside SLURM's requeued copy. No rule passes --requeue through slurm_extra behind the plugin's back."""
    from snakemake.cli import parse_args
    from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry

    monkeypatch.chdir(PROJECT)
    _, args = parse_args(["--workflow-profile", "profiles/slurm", "--snakefile", "Snakefile", "-n"])
    settings = ExecutorPluginRegistry().get_plugin("slurm").get_settings(args)
    assert args.executor == "slurm" and settings.requeue and not settings.no_requeue
    profile = yaml.safe_load((PROJECT / "profiles/slurm/config.yaml").read_text())
    resources = [profile["default-resources"], *profile["set-resources"].values()]
    assert all("requeue" not in str(entry.get("slurm_extra", "")) for entry in resources)
