"""What the DAG needs from Snakemake's SLURM executor plugin that the plugin does not do yet.

`sacct --parsable2 -o State` reports a job cancelled by a user or an admin as `CANCELLED by <uid>`
(SLURM 22.05, found with `scancel` on the local cluster). The plugin (2.8.0) compares the whole
string with its failure states, finds no match, and keeps waiting for the job: Snakemake never
ends. `normalize_states` keeps the state's first word, which is what the plugin compares;
`patch_slurm_plugin` wraps the plugin's status query with it. The Snakefile calls it when it runs
under a non-local executor. Remove it once the plugin strips the suffix itself.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any


def normalize_states(states: dict[str, str] | None) -> dict[str, str] | None:
    """`{"164": "CANCELLED by 0"}` -> `{"164": "CANCELLED"}`; other states are one word already."""
    if states is None:
        return None
    return {job: state.split()[0] if state.strip() else state for job, state in states.items()}


def patch_slurm_plugin() -> bool:
    """Wrap the plugin's status query (True), or do nothing where the plugin is absent or its shape
    changed (False: the plugin is then used as it is)."""
    try:
        import snakemake_executor_plugin_slurm as plugin
    except ImportError:
        return False
    query: Callable[..., Awaitable[Any]] | None = getattr(plugin, "query_job_status", None)
    if query is None or getattr(query, "meml_normalized", False):
        return query is not None

    @functools.wraps(query)
    async def normalized(*args: Any, **kwargs: Any) -> Any:
        result = await query(*args, **kwargs)
        if isinstance(result, tuple) and len(result) == 2:
            states, seconds = result
            return normalize_states(states), seconds
        return result

    normalized.meml_normalized = True  # type: ignore[attr-defined]
    plugin.query_job_status = normalized
    return True
