"""config/README.md's key table is generated from config/schema.yaml's descriptions, the one home of
what a key means: the committed copy must be what the schema gives, and every key a config may set
must have its meaning there."""

from __future__ import annotations

from conftest import PROJECT

from meml.core.config import load_config, schema
from meml.core.config_keys import BEGIN, README, rows, table, with_table


def test_the_readme_holds_the_table_the_schema_gives() -> None:
    text = README.read_text()
    assert text == with_table(text), "config/README.md is stale: python -m meml.core.config_keys --write"
    assert README == PROJECT / "config" / "README.md"


def _leaves(value: object, path: str) -> list[str]:
    if isinstance(value, dict) and value:
        return [leaf for k, v in value.items() for leaf in _leaves(v, f"{path}.{k}" if path else k)]
    return [path]


def test_every_key_of_the_default_config_has_its_meaning() -> None:
    """A key of config/default.yaml is described itself, or under a section or entry described whole
    (`rl_by_dataset.<ds>`, `methods.<name>`, a calibration range)."""
    described = {k for keys, _ in rows() for k in keys}
    placeholders = {"models": "<name>", "methods": "<name>", "teachers": "e<k>", "data": "<ds>",
                    "rl_by_dataset": "<ds>", "toy.sizes": "<ds>"}  # fmt: skip
    missing = []
    for leaf in _leaves(load_config(), ""):
        parts = leaf.split(".")
        for prefix, entry in placeholders.items():
            depth = prefix.count(".") + 1
            if ".".join(parts[:depth]) == prefix and len(parts) > depth:
                parts[depth] = entry
        shown = [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
        if not any(s in described for s in shown):
            missing.append(leaf)
    assert not missing, missing


def test_neighbouring_keys_with_one_meaning_share_a_row() -> None:
    rules = {
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"x": {"description": "same"}, "y": {"description": "same"}}},
            "b": {"type": "object", "x-entry": "<name>", "additionalProperties": {"$ref": "#/$defs/e"}},
        },
        "$defs": {"e": {"type": "object", "properties": {"z": {"description": "z | pipe"}}}},
    }
    assert rows(rules) == [(["a.x", "a.y"], "same"), (["b.<name>.z"], "z | pipe")]
    assert "| `b.<name>.z` | z \\| pipe |" in table(rules)
    assert schema()["properties"]["models"]["x-entry"] == "<name>"


def test_the_readme_names_every_run_key() -> None:
    """config/README.md lists the keys that rerun nothing (core/config.RUN_KEYS) by hand, above the
    table: a run key added to the code must be added there (a teacher's by its own name, `mlflow.*` as
    the section)."""
    from meml.core.config import RUN_KEYS

    text = README.read_text().split(BEGIN)[0]
    for key in RUN_KEYS:
        shown = key.removesuffix(".*") if key.endswith(".*") else key.rpartition("*.")[2]
        assert f"`{shown}`" in text, key
