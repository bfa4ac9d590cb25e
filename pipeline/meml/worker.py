"""A warm worker for the DAG's many short jobs.

A toy job trains or evaluates for a few seconds but spends 7-15 s importing torch, transformers,
lm-eval and MLflow (measured: `scripts/dag_breakdown.py`, README). The worker imports them once;
each job then runs in a child forked from it, with the job's own working folder, environment,
arguments and stdout/stderr, and reports its exit code. It is what multiprocessing's forkserver
does, for whole commands:

    python -m meml.worker --socket PATH   the server (Snakemake's `onstart` starts it, `onsuccess`
                                    and `onerror` stop it; it also exits when Snakemake does)
    python -m meml.run ARGS         a job: runs `meml ARGS` in the worker when MEML_WORKER names
                                    a live socket, else exactly as `python -m meml.cli ARGS`

Fork safety: the server only imports; it runs no torch operation (so no thread pool exists to be
copied) and opens no database connection; the child sets torch's thread count from the job's
OMP_NUM_THREADS. A job signalled by Snakemake (SIGTERM, SIGINT) passes the signal to its child.
Linux only (macOS forbids fork after some frameworks load); elsewhere jobs run as fresh processes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

PRELOAD = (
    "torch",
    "transformers",
    "transformers.modeling_utils",  # the model classes' base and the attention kernels (core/attention.py)
    "transformers.masking_utils",
    "meml.core.attention",
    "meml.training.rl",
    "meml.training.sft",
    "meml.evaluation.evaluate",
    "meml.evaluation.kv_lm",  # registers the lm-eval model class the kv backend uses
    "meml.evaluation.complementarity",
    "meml.core.tracking",
    "mlflow",
    "mlflow.store.tracking.sqlalchemy_store",  # imported lazily at a run's first call otherwise (1.3 s)
    "lm_eval",
    "lm_eval.models.huggingface",
    "trl",
)


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401 - resolve the lazy modules


def _send(conn: socket.socket, value: int) -> None:
    conn.sendall(struct.pack("!q", value))


def _receive(conn: socket.socket) -> int:
    data = b""
    while len(data) < 8:
        chunk = conn.recv(8 - len(data))
        if not chunk:
            raise ConnectionError("the worker closed the connection")
        data += chunk
    return int(struct.unpack("!q", data)[0])


def _child(request: dict[str, Any], fds: list[int]) -> int:
    """Run one job in the forked child: its folder, environment, argv, stdout and stderr."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the server's "exit quietly" is not the job's
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in fds:
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = ["meml", *request["argv"]]
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or torch.get_num_threads()))
    from meml.cli import main

    try:
        return main(request["argv"])
    except SystemExit as exit:  # argparse and friends
        return exit.code if isinstance(exit.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
        return 1


def _handle(conn: socket.socket) -> None:
    # the request: 8 bytes of length, then JSON; the job's stdout and stderr ride on the first chunk
    head, fds, _, _ = socket.recv_fds(conn, 1 << 16, 2)
    size, body = struct.unpack("!q", head[:8])[0], head[8:]
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ConnectionError("the job closed the connection mid-request")
        body += chunk
    request = json.loads(body)
    pid = os.fork()
    if pid == 0:  # the job
        code = 1
        try:
            conn.close()
            code = _child(request, fds)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    for fd in fds:
        os.close(fd)

    def wait() -> None:
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        try:
            _send(conn, code)
        finally:
            conn.close()

    _send(conn, pid)
    threading.Thread(target=wait, daemon=True).start()


def serve(path: str | Path) -> None:
    """Preload, then fork a child per job until told to stop or until the parent process exits."""
    _preload()
    path = Path(path)
    path.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(64)
    parent = os.getppid()

    def orphaned() -> None:  # Snakemake died without stopping us: stop too
        while os.getppid() == parent:
            time.sleep(2)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=orphaned, daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            conn, _ = server.accept()
            _handle(conn)
    finally:
        server.close()
        path.unlink(missing_ok=True)


def run_in_worker(path: str, argv: list[str]) -> int:
    """Send one job to the worker; forward SIGTERM and SIGINT to it; return its exit code.
    Raises OSError when the worker cannot be reached (the caller then runs the job itself); once
    the job has started, a lost worker is the job's failure, never a second start."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    payload = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    message = struct.pack("!q", len(payload)) + payload
    sent = socket.send_fds(conn, [message], [1, 2])
    conn.sendall(message[sent:])
    pid = _receive(conn)  # a ConnectionError here: nothing started

    def forward(signum: int, _: Any) -> None:
        os.kill(pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        return _receive(conn)
    except ConnectionError:
        print(f"meml: the worker stopped while job {pid} ran", file=sys.stderr)
        return 1


def socket_path() -> Path:
    """A socket path of this Snakemake process (Unix sockets allow about 100 characters)."""
    import tempfile

    return Path(tempfile.gettempdir()) / f"meml-worker-{os.getpid()}.sock"


def start(path: str | Path, env: dict[str, str] | None = None, timeout: float = 120.0, device: str = "cpu") -> Any:
    """Start a worker in the background and wait until it listens. None where fork is unsafe
    (not Linux), on a GPU (`device` cuda: CUDA does not survive a fork once any library in the
    parent has touched it, and the libraries the worker imports may; a job's GPUs are also chosen
    by meml.core.gpus before it starts, which a forked child could not honour for a parent's CUDA
    state), when MEML_NO_WORKER is set, or when it does not come up: jobs then run as fresh
    processes, slower and otherwise the same."""
    import subprocess

    if sys.platform != "linux" or os.environ.get("MEML_NO_WORKER") or device == "cuda":
        return None
    path = Path(path)
    path.unlink(missing_ok=True)
    process = subprocess.Popen(
        [sys.executable, "-m", "meml.worker", "--socket", str(path)],
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(path.with_suffix(".log"), "w"),  # noqa: SIM115 - kept open by the child
    )
    deadline = time.time() + timeout
    while not path.exists():
        if process.poll() is not None or time.time() > deadline:
            process.kill()
            return None  # jobs then run as fresh processes: slower, never wrong
        time.sleep(0.1)
    return process


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python -m meml.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True, help="the Unix socket to listen on")
    serve(parser.parse_args().socket)
