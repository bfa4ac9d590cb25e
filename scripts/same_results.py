"""Do two results folders hold the same numbers? Every file of the first is compared with its
namesake in the second, byte for byte; a file that differs is compared again without what records
time or place, and counts as the same when only those differ:
  - JSON and JSONL (DONE markers too): without seconds, dates, MLflow ids, the environment, paths;
  - PDF figures: without their /CreationDate;
  - checkpoints (state.pt): tensor by tensor, without Python's own `random` state, which runs
    before the RL job seeded it were not given; a checkpoint's COMPLETE marker by its step (its
    checksum is the state.pt's).
MLflow's store and artifacts, logs, locks and the progress line's state are left out (run ids and
times by nature).

    python scripts/same_results.py BEFORE/results/toy AFTER/results/toy [--declared sft.checkpoint_every]

Prints a count per kind (identical, same but for timings, changed as declared, different, missing)
and each differing file, a JSON one with the keys where it differs (`sft.checkpoint_every`,
`[3].reward/mean`: what changed, not just where); exits 1 when any file differs or is missing.
`--declared KEY` names a key a change means to alter (a setting that left a cell's values, say): a
JSON file that differs at such keys alone counts as "changed as declared", listed with them, and
does not fail the check; a difference anywhere else still does.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

SKIPPED = re.compile(
    r"(^|/)(mlflow\.db|mlartifacts|logs?|\.snakemake)(/|$)|\.lock$|(^|/)(mlflow_run_id|\.progress\.json)$"
)
# keys whose values are when, how long, where or which MLflow run: they differ between identical runs
PLACE_OR_TIME = re.compile(
    r"^perf/|seconds|_time$|^time$|^wall|^started|^finished_at|^date$|mlflow|^environment$|^run_id$"
)


def without_place_or_time(value: Any, roots: tuple[str, ...]) -> Any:
    if isinstance(value, dict):
        return {k: without_place_or_time(v, roots) for k, v in value.items() if not PLACE_OR_TIME.search(str(k))}
    if isinstance(value, list):
        return [without_place_or_time(v, roots) for v in value]
    if isinstance(value, str):
        for root in roots:
            value = value.replace(root, "<root>")
    return value


def same_checkpoint(a: Path, b: Path) -> bool:
    import torch

    def strip(state: Any) -> Any:
        state = dict(state)
        state["rng"] = [{k: v for k, v in r.items() if k != "python"} for r in state["rng"]]
        return state

    def equal(x: Any, y: Any) -> bool:
        if isinstance(x, torch.Tensor):
            return isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y)
        if isinstance(x, dict):
            return isinstance(y, dict) and list(x) == list(y) and all(equal(x[k], y[k]) for k in x)
        if isinstance(x, (list, tuple)):
            return isinstance(y, (list, tuple)) and len(x) == len(y) and all(map(equal, x, y))
        return bool(x == y)

    return equal(strip(torch.load(a, weights_only=False)), strip(torch.load(b, weights_only=False)))


def same_but_for_time(a: Path, b: Path, roots: tuple[str, ...]) -> bool:
    if a.suffix in (".json", ".jsonl") or a.name == "DONE":
        return bool(parsed(a, roots) == parsed(b, roots))
    if a.suffix == ".pdf":
        date = re.compile(rb"/CreationDate \(D:[0-9Z+\-']*\)")
        return date.sub(b"", a.read_bytes()) == date.sub(b"", b.read_bytes())
    if a.name == "state.pt":
        return same_checkpoint(a, b)
    if a.name == "COMPLETE":  # the step, then the state.pt's checksum (compared above)
        return a.read_text().splitlines()[0] == b.read_text().splitlines()[0]
    return False


def parsed(path: Path, roots: tuple[str, ...]) -> Any:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        return [without_place_or_time(json.loads(line), roots) for line in text.splitlines() if line.strip()]
    return without_place_or_time(json.loads(text), roots)


def differing_keys(x: Any, y: Any, at: str = "") -> list[str]:
    """The dotted paths at which two parsed JSON values differ (a key on one side only included)."""
    if isinstance(x, dict) and isinstance(y, dict):
        out = []
        for key in [*x, *(k for k in y if k not in x)]:
            where = f"{at}.{key}" if at else str(key)
            out += [where] if (key in x) != (key in y) else differing_keys(x[key], y[key], where)
        return out
    if isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
        return [k for i, (u, v) in enumerate(zip(x, y, strict=True)) for k in differing_keys(u, v, f"{at}[{i}]")]
    return [] if x == y else [at or "(the whole value)"]


def explained(name: str, a: Path, b: Path, roots: tuple[str, ...]) -> str:
    """A differing file's name, with where a JSON file differs."""
    if not (a.suffix in (".json", ".jsonl") or a.name == "DONE"):
        return name
    try:
        keys = differing_keys(parsed(a, roots), parsed(b, roots))
    except ValueError:  # not JSON after all
        return name
    shown = ", ".join(keys[:6]) + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")
    return f"{name} (at {shown})"


def only_declared(a: Path, b: Path, roots: tuple[str, ...], declared: tuple[str, ...]) -> bool:
    """Whether a JSON file differs at declared keys alone (a key path ending in one of them)."""
    if not declared or not (a.suffix in (".json", ".jsonl") or a.name == "DONE"):
        return False
    try:
        keys = differing_keys(parsed(a, roots), parsed(b, roots))
    except ValueError:
        return False
    return bool(keys) and all(any(k == d or k.endswith(f".{d}") for d in declared) for k in keys)


def compare(a: Path, b: Path, declared: tuple[str, ...] = ()) -> dict[str, list[str]]:
    roots = tuple(str(p.resolve().parents[1]) for p in (a, b))  # the two checkouts' folders
    kinds: dict[str, list[str]] = {"identical": [], "same but for timings": [], "changed as declared": [],
                                   "different": [], "missing": []}  # fmt: skip
    for path in sorted(p for p in a.rglob("*") if p.is_file()):
        name = path.relative_to(a).as_posix()
        if SKIPPED.search(name):
            continue
        other = b / name
        if not other.is_file():
            kinds["missing"].append(name)
        elif path.read_bytes() == other.read_bytes():
            kinds["identical"].append(name)
        elif same_but_for_time(path, other, roots):
            kinds["same but for timings"].append(name)
        elif only_declared(path, other, roots, declared):
            kinds["changed as declared"].append(explained(name, path, other, roots))
        else:
            kinds["different"].append(explained(name, path, other, roots))
    return kinds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("--declared", action="append", default=[], help="a key the change means to alter")
    args = parser.parse_args()
    kinds = compare(args.first, args.second, tuple(args.declared))
    for kind, names in kinds.items():
        print(f"{kind}: {len(names)}")
    for kind in ("changed as declared", "different", "missing"):
        for name in kinds[kind]:
            print(f"  {kind}: {name}")
    weights = [n for n in kinds["identical"] if n.endswith(".safetensors")]
    print(f"model weights identical: {len(weights)}")
    return 1 if kinds["different"] or kinds["missing"] else 0


if __name__ == "__main__":
    sys.exit(main())
