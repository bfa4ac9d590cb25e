"""`python -m meml.core.gpus N COMMAND...`: run a DAG job on N GPUs of its own.

Snakemake's `--resources gpu=K` only counts: it lets jobs start while their `gpu` adds up to at
most K, and says nothing about which GPU each one gets. Without this, every single-process job
would take cuda:0 and every `accelerate launch` the first N. Here a job takes N free slots of the
node's GPUs, each held by an exclusive lock on a file (fcntl.flock), sets CUDA_VISIBLE_DEVICES to
them and runs the command as its child, passing on the signals Snakemake sends; the locks go
when this process ends, however it ends.

    the node's GPUs     CUDA_VISIBLE_DEVICES of the workflow if set, else `nvidia-smi -L`;
                        MEML_SIMULATE_GPUS=K: K pretend GPUs on a CPU (the same assignment,
                        recorded, so that it can be tested without a GPU)
    the locks           MEML_GPU_LOCKS (default /tmp/meml-gpus-<uid>): one file a GPU, shared by
                        every workflow on the node, so two workflows side by side do not collide
    the record          MEML_GPU_LOG, when set (the Snakefile sets logs/<profile>/gpus.jsonl):
                        a line per job when it ends, {job, devices, start, end, returncode}; and
                        MEML_DEVICES in its environment (the RL and SFT jobs write it into their
                        DONE's `environment`)
    under SLURM         a job that SLURM placed (SLURM_JOB_ID with CUDA_VISIBLE_DEVICES set) has
                        its own GPUs already: nothing is locked
    the CUDA check      on real GPUs, before the command: `python -m meml.core.cuda_check` on the
                        job's GPUs (torch's CUDA build, the driver, a usable GPU); the job fails
                        there, saying which, rather than running on the CPU or dying later
    N = 0               the command runs as it is
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

WAIT_NOTE_SECONDS = 60  # a job still waiting for GPUs after this long says so in its log


def node_gpus() -> list[str]:
    """The GPU ids jobs on this node may take."""
    simulated = os.environ.get("MEML_SIMULATE_GPUS")
    if simulated:
        return [str(i) for i in range(int(simulated))]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return [v for v in visible.split(",") if v.strip()]
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(line for line in listed.splitlines() if line.startswith("GPU "))]


def lock_dir() -> Path:
    return Path(os.environ.get("MEML_GPU_LOCKS") or f"/tmp/meml-gpus-{os.getuid()}")


def take(n: int, gpus: list[str], folder: Path, wait_note: float = WAIT_NOTE_SECONDS) -> tuple[list[str], list[int]]:
    """N of `gpus`, each locked by an open file descriptor (kept open: it holds the lock). Waits
    while fewer than N are free (Snakemake's gpu count makes that rare: a job of another workflow)."""
    if n > len(gpus):
        raise SystemExit(f"meml.gpus: the job needs {n} GPU(s), the node has {len(gpus)} ({','.join(gpus) or 'none'})")
    folder.mkdir(parents=True, exist_ok=True)
    started, noted = time.monotonic(), False
    while True:
        held: list[tuple[str, int]] = []
        for gpu in gpus:
            fd = os.open(folder / f"gpu{gpu}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            held.append((gpu, fd))
            if len(held) == n:
                return [g for g, _ in held], [fd for _, fd in held]
        for _, fd in held:  # not enough: let go and try again, so that two waiting jobs cannot deadlock
            os.close(fd)
        if not noted and time.monotonic() - started > wait_note:
            print(f"meml.gpus: waiting for {n} free GPU(s) of {len(gpus)} (locks in {folder})", file=sys.stderr)
            noted = True
        time.sleep(0.5)


_CLAIMED: list[int] = []  # the locks of claim(), held for the life of the process


def claim(n: int) -> list[str]:
    """From inside a job, before anything touches CUDA: take N GPUs of the node as `main` does and
    make them the process's CUDA_VISIBLE_DEVICES (the teacher job, whose GPU depends on its
    backend). A job that already runs on GPUs of its own (under `main`, or placed by SLURM) keeps them."""
    if os.environ.get("MEML_DEVICES") or (os.environ.get("SLURM_JOB_ID") and os.environ.get("CUDA_VISIBLE_DEVICES")):
        return (os.environ.get("MEML_DEVICES") or os.environ["CUDA_VISIBLE_DEVICES"]).split(",")
    gpus = node_gpus()
    if not gpus:  # a CPU machine: nothing to place
        return []
    devices, fds = take(n, gpus, lock_dir())
    _CLAIMED.extend(fds)
    os.environ["CUDA_VISIBLE_DEVICES"] = os.environ["MEML_DEVICES"] = ",".join(devices)
    return devices


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit():
        print("usage: python -m meml.core.gpus N COMMAND [ARGS...]", file=sys.stderr)
        return 2
    n, command = int(argv[0]), argv[1:]
    if n == 0:
        os.execvp(command[0], command)
    if os.environ.get("SLURM_JOB_ID") and os.environ.get("CUDA_VISIBLE_DEVICES"):
        devices = os.environ["CUDA_VISIBLE_DEVICES"].split(",")  # SLURM's own placement
    else:
        devices, _held = take(n, node_gpus(), lock_dir())  # held until this process ends
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(devices), "MEML_DEVICES": ",".join(devices)}
    if not os.environ.get("MEML_SIMULATE_GPUS"):  # real GPUs: usable by this torch? (core/cuda_check.py)
        checked = subprocess.run([sys.executable, "-m", "meml.core.cuda_check"], env=env)
        if checked.returncode != 0:
            print(f"meml.gpus: not starting {' '.join(command)}: the CUDA check failed (above)", file=sys.stderr)
            return checked.returncode
    start = time.time()
    child = subprocess.Popen(command, env=env)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda number, _frame: child.send_signal(number))
    returncode = child.wait()
    log = os.environ.get("MEML_GPU_LOG")
    if log:
        record = {"job": " ".join(command), "devices": env["MEML_DEVICES"], "start": start, "end": time.time(),
                  "returncode": returncode}  # fmt: skip
        with open(log, "a", encoding="utf-8") as f:  # one line, one write: appends do not interleave
            f.write(json.dumps(record) + "\n")
    return returncode if returncode >= 0 else 128 - returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
