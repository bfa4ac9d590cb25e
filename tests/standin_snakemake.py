"""`python tests/standin_snakemake.py RECORD SECONDS SNAKEMAKE-ARGS...`: Snakemake's own scheduler over
the workflow's DAG with every job a stand-in (tests/test_schedule.py).

Snakemake runs a local shell job through `snakemake.executors.local.run_wrapper`, in a thread of its
own process; that function is replaced here, so the scheduler, the DAG, the rules' threads and
resources and the onstart and onsuccess hooks are the workflow's own and only the job's work is
not. A job that holds GPUs sleeps SECONDS on GPUs of its own, placed by meml.core.gpus as a real
job's are (MEML_SIMULATE_GPUS pretend GPUs); any other job sleeps a tenth as long. Then its outputs
are written, empty ("{}" for JSON), and one line {rule, threads, gpu, start, end} goes to RECORD.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import snakemake.executors.local as local
from snakemake.cli import main

PIPELINE = Path(__file__).resolve().parents[1] / "pipeline"
_LOCK = threading.Lock()


def standin(job_rule: Any, input: Any, output: Any, params: Any, wildcards: Any, threads: int, resources: Any,
            *rest: Any) -> None:  # fmt: skip
    record, seconds = Path(sys.argv[1]), float(sys.argv[2])
    gpu = int(getattr(resources, "gpu", 0) or 0)
    start = time.time()
    if gpu:
        env = {**os.environ, "PYTHONPATH": str(PIPELINE)}
        subprocess.run([sys.executable, "-m", "meml.core.gpus", str(gpu), "sleep", str(seconds)], check=True, env=env)
    else:
        time.sleep(seconds / 10)
    for name in output:
        path = Path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}" if path.suffix == ".json" else "")
    line = {"rule": job_rule.name, "threads": threads, "gpu": gpu, "start": start, "end": time.time(),
            "output": list(output)}  # fmt: skip
    with _LOCK, record.open("a") as f:
        f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    local.run_wrapper = standin
    sys.exit(main(sys.argv[3:]))
