"""What a run's numbers depend on besides its config: the machine, the thread count, the library
versions and the weights it started from. Written into every SFT and RL run's DONE file and
logged as the RL run's MLflow params (`environment.*`).

Why: the same seed gives the same numbers only on the same machine with the same threads and
versions. Another CPU make (Intel or AMD) or another thread count changes the order of float
additions in matrix products, so a sampled token can flip and the runs part ways from there (the
toy study drew other SFT models on another machine of the same kind). A record that differs
explains two runs that differ; a record that matches and numbers that differ is a bug.
"""

from __future__ import annotations

import hashlib
import os
import platform
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what the platform module knows."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def weights_sha256(folder: str | Path) -> str:
    """SHA-256 over a model folder's weight files (name and bytes, files in name order): the same
    value for the same weights wherever the folder lies."""
    files = sorted(p for p in Path(folder).iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
    if not files:
        raise FileNotFoundError(f"{folder}: no weight files (*.safetensors, *.bin) to hash")
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def environment_record(start_model: str | Path, device: str = "cpu", start_sha256: str | None = None) -> dict[str, Any]:
    """The run's environment: CPU (and GPU where one is used), torch's thread count, library
    versions, and the hash of the weights the run started from (`start_sha256` where the caller
    hashed them already: a 1.5B model's weights take seconds to read)."""
    import torch
    import transformers

    env: dict[str, Any] = {
        "cpu": cpu_model(),
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": device,
        "start_weights_sha256": start_sha256 or weights_sha256(start_model),
    }
    if os.environ.get("MEML_DEVICES"):  # the GPUs meml.core.gpus gave the job (or MEML_SIMULATE_GPUS's)
        env["devices"] = os.environ["MEML_DEVICES"]
    if device.startswith("cuda") and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return env
