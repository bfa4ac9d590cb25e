"""Everything the workflow checks while it is parsed, before any job: one call from the Snakefile.

    at_parse(config, argv, main_process=..., dry_run=...)

1. The config against config/schema.yaml, its defaults filled in place (inside named entries too),
   and the checks across keys (grid.check); an error names the key.
2. A target on the command line naming a model, data set, method or seed this config lacks
   (targets.py): one line naming it and the valid values, where Snakemake would say "No rule to
   produce". Snakemake hands the Snakefile no targets while it is parsed, so they are read from argv.
3. For a real-world or GPU run: what it needs and what the grid will cost (preflight.py, cost.py),
   printed before the job list and again at the very end of a dry run (its list runs to hundreds of
   lines); then what would fail after money is spent, refused.

2 and 3 run in Snakemake's main process only, never inside each job.
"""

from __future__ import annotations

import atexit
import sys
from typing import Any

from meml.core.io import DataError


def at_parse(config: dict[str, Any], argv: list[str], *, main_process: bool, dry_run: bool) -> None:
    from meml.core.config import validate
    from meml.data.experts import prompts_of
    from meml.plan import grid

    try:
        # the CLI's own check, which errs naming the key; it stands in for snakemake.utils.validate,
        # which checks the same schema 0.3 s slower (a quarter of a no-op rerun)
        config.update(validate(config))
        grid.check(config, len(prompts_of(config)))
    except DataError as err:
        raise ValueError(str(err) if "invalid config" in str(err) else f"invalid config: {err}") from None
    if not main_process:
        return
    from meml.plan import targets

    try:
        targets.check(config, targets.named_on(argv))
    except DataError as err:
        raise ValueError(str(err)) from None
    if config["device"] == "cuda" or config["world"] == "real":
        _before_money(config, dry_run)


def _before_money(config: dict[str, Any], dry_run: bool) -> None:
    from meml.plan import cost, preflight
    from meml.plan.layout import Layout

    estimate = cost.headlines_both_engines(config, Layout.of(config).root / "cost_throughput.json")
    memory, too_big = preflight.update_memory(config)
    said = preflight.block(config, [*memory, *estimate] if config["device"] == "cuda" else [])
    print(said, file=sys.stderr)
    refused = [*too_big, *preflight.refusals(config)]
    if refused:
        raise ValueError("this run would fail after money is spent; fix first:\n  " + "\n  ".join(refused))
    if dry_run:
        atexit.register(lambda: print("\n" + said, file=sys.stderr))
