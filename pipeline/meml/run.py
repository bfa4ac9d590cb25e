"""`python -m meml.run ARGS`: run `meml ARGS` in the warm worker named by MEML_WORKER (worker.py),
or, when there is none, as `python -m meml.cli ARGS` in this process. Kept free of heavy imports:
it is the part of every DAG job that is not in the worker."""

from __future__ import annotations

import os
import sys


def main() -> int:
    path = os.environ.get("MEML_WORKER")
    if path and os.path.exists(path):
        from meml.worker import run_in_worker

        try:
            return run_in_worker(path, sys.argv[1:])
        except OSError:  # refused, gone, or closed before the job started: run it here
            pass
    from meml.cli import main as cli_main

    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
