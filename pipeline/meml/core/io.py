"""File I/O with two guarantees: errors name the file, line and field; writes are atomic.

Every output goes to a temporary name in the same folder and is renamed into place, so an
interrupted step never leaves a half-written file that a later step would trust.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class DataError(ValueError):
    """Bad input. The message names where: file, line (1-based; or "record N" in a JSON array), field."""

    def __init__(
        self,
        message: str,
        path: str | os.PathLike[str] | None = None,
        line: int | str | None = None,
        field: str | None = None,
    ) -> None:
        self.path = str(path) if path is not None else None
        self.line = line
        self.field = field
        where = []
        if self.path is not None:
            where.append(self.path)
        if line is not None:
            where.append(f"line {line}" if isinstance(line, int) else line)  # a str says e.g. "record 12"
        if field is not None:
            where.append(f"field '{field}'")
        prefix = ", ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)


@contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w") -> Iterator[IO[Any]]:
    """Open a temporary file beside `path`; rename it onto `path` only if the block succeeds."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; outputs should read like any other file
    try:
        handle: IO[Any] = os.fdopen(fd, mode) if "b" in mode else os.fdopen(fd, mode, encoding="utf-8", newline="\n")
        with handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    with atomic_open(path, "w") as handle:
        handle.write(text)


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=False) + "\n")


def atomic_write_jsonl(path: str | os.PathLike[str], rows: Iterable[dict[str, Any]]) -> int:
    count = 0
    with atomic_open(path, "w") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    return count


def read_jsonl(path: str | os.PathLike[str]) -> list[tuple[int, dict[str, Any]]]:
    """Read a JSON Lines file as (line number, object) pairs; blank lines are skipped.

    An absent file, an empty file, a line that is not JSON, or a line that is not an object
    raises DataError naming the file and line.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError("file not found", p)
    rows: list[tuple[int, dict[str, Any]]] = []
    with p.open("rb") as handle:
        for number, data in enumerate(handle, start=1):
            raw = _utf8(data, p, number)
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as err:
                raise DataError(f"not valid JSON ({err.msg} at column {err.colno})", p, number) from None
            if not isinstance(obj, dict):
                raise DataError(f"expected a JSON object, got {type(obj).__name__}", p, number)
            rows.append((number, obj))
    if not rows:
        raise DataError("file is empty: no records", p)
    return rows


def _utf8(data: bytes, path: Path, line: int) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"not UTF-8 (byte {data[err.start]:#04x} at column {err.start + 1})", path, line) from None


def read_json(path: str | os.PathLike[str]) -> Any:
    p = Path(path)
    if not p.is_file():
        raise DataError("file not found", p)
    data = p.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"not UTF-8 (byte {data[err.start]:#04x})", p, data[: err.start].count(b"\n") + 1) from None
    if not text.strip():
        raise DataError("file is empty", p)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"not valid JSON ({err.msg})", p, err.lineno) from None


@contextmanager
def run_lock(target: str | os.PathLike[str], folder: bool = True) -> Iterator[None]:
    """Hold `<folder>/.lock` (or `<file>.lock` beside a file) for as long as the block runs; the
    OS releases it when the process dies, so a killed job never leaves a stale lock. A second
    process that asks for it is refused at once with the holder's pid: two writers of one run
    folder would overwrite each other's metrics and checkpoints."""
    import fcntl

    path = Path(target)
    lock = path / ".lock" if folder else path.with_name(path.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise DataError(
            f"another process (pid {holder}) is writing here; wait for it to finish or stop it", path
        ) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def locked(out_arg: str, folder: bool = True) -> Callable[[F], F]:
    """Run the decorated stage under `run_lock` of its output (the argument named `out_arg`, a
    folder or a file; `paths.out` names an attribute of the argument `paths`). Under `accelerate
    launch` only the main process (RANK 0) writes, so only it takes the lock."""
    import functools
    import inspect

    def wrap(fn: F) -> F:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            if int(os.environ.get("RANK", "0")) != 0:
                return fn(*args, **kwargs)
            name, *attributes = out_arg.split(".")
            target = signature.bind(*args, **kwargs).arguments[name]
            for attribute in attributes:
                target = getattr(target, attribute)
            with run_lock(target, folder):
                return fn(*args, **kwargs)

        return inner  # type: ignore[return-value]

    return wrap
