"""The key table of config/README.md, generated from config/schema.yaml: each key's `description`
there is the one home of what the key means (its value and the reason for it live in
config/default.yaml). A mapping of named entries (models, methods, teachers, data sets) shows its
entries' keys under the placeholder its `x-entry` annotation names (`models.<name>.source`).
Neighbouring keys with the same description share a row.

    python -m meml.core.config_keys --write   # rewrite the table in config/README.md
    python -m meml.core.config_keys           # print it

tests/test_config_keys.py holds the README's copy to the schema.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from meml.core.config import schema

README = Path(__file__).resolve().parents[3] / "config" / "README.md"
BEGIN = "<!-- keys: generated from config/schema.yaml by `python -m meml.core.config_keys --write` -->"
END = "<!-- end of keys -->"
PIPE = "\\|"


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """A node with its $ref followed (the reference's keys, then the node's own beside it)."""
    if "$ref" in node:
        return {**defs[node["$ref"].split("/")[-1]], **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def rows(rules: dict[str, Any] | None = None) -> list[tuple[list[str], str]]:
    """(keys, meaning) in the schema's order."""
    rules = rules or schema()
    defs = rules.get("$defs", {})
    found: list[tuple[str, str]] = []

    def walk(node: dict[str, Any], path: list[str]) -> None:
        node = _resolve(node, defs)
        if path and "description" in node:
            found.append((".".join(path), " ".join(str(node["description"]).split())))
        entry = node.get("x-entry")
        properties = node.get("properties") or {}
        if entry and properties:  # every entry has the same keys (data.gsm8k, data.mathqa, ...)
            walk(next(iter(properties.values())), [*path, entry])
        elif entry and isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], [*path, entry])
        else:
            for name, child in properties.items():
                walk(child, [*path, name])

    walk(rules, [])
    merged: list[tuple[list[str], str]] = []
    for key, meaning in found:
        if merged and merged[-1][1] == meaning:
            merged[-1][0].append(key)
        else:
            merged.append(([key], meaning))
    return merged


def table(rules: dict[str, Any] | None = None) -> str:
    lines = ["| key | meaning |", "| --- | --- |"]
    for keys, meaning in rows(rules):
        shown = meaning.replace("|", PIPE)  # a pipe inside a cell, code spans too, must be escaped
        lines.append(f"| {', '.join(f'`{k}`' for k in keys)} | {shown} |")
    return "\n".join(lines)


def with_table(readme: str, rules: dict[str, Any] | None = None) -> str:
    """The README's text with the block between BEGIN and END replaced by the generated table."""
    if BEGIN not in readme or END not in readme:
        raise ValueError(f"{README}: the markers {BEGIN!r} and {END!r} are missing")
    before, rest = readme.split(BEGIN, 1)
    after = rest.split(END, 1)[1]
    return f"{before}{BEGIN}\n\n{table(rules)}\n\n{END}{after}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="rewrite the table in config/README.md")
    args = parser.parse_args()
    if args.write:
        README.write_text(with_table(README.read_text()))
        print(f"written: {README}")
    else:
        print(table())


if __name__ == "__main__":
    main()
