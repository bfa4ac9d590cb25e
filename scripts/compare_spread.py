"""What a change of design adds to the training spread: two reports' "Where the spread comes from"
lines side by side (the seed sd of each method and claimed difference, per cell), and the
difference of their seed variances, summed over the claimed differences.

    .venv/bin/python scripts/compare_spread.py OLD/index.md NEW/index.md

Used to measure what redrawing the training data in every seed adds (the new design's seed
variance minus the old one's, same config and base seed otherwise): the stages table's method,
applied across two reports when the old run's results are no longer on disk. Each sd comes from
5 seeds (4 degrees of freedom), so single lines are noisy; the sum over lines is the figure.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

CELL = re.compile(r"^- (\S+) x (\S+), training / test: (.*)\.$")
DIFF = re.compile(r"^  - (.+?): training ([0-9.]+), test ([0-9.]+)\.$")


def spread(index: Path) -> dict[str, tuple[float, float]]:
    """'<cell> <difference>' -> (training sd, test sd) from a report's index.md."""
    out: dict[str, tuple[float, float]] = {}
    cell = ""
    for line in index.read_text().splitlines():
        if match := CELL.match(line):
            cell = f"{match.group(1)} x {match.group(2)}"
        elif (match := DIFF.match(line)) and cell:
            out[f"{cell}: {match.group(1)}"] = (float(match.group(2)), float(match.group(3)))
    if not out:
        raise SystemExit(f"{index}: no 'Where the spread comes from' lines")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    args = parser.parse_args()
    old, new = spread(args.old), spread(args.new)
    shared = [k for k in new if k in old]
    total_old = total_new = 0.0
    print(f"{'difference':70} {'old sd':>7} {'new sd':>7} {'added variance':>15}")
    for key in shared:
        (o, _), (n, _) = old[key], new[key]
        total_old, total_new = total_old + o * o, total_new + n * n
        print(f"{key:70} {o:7.1f} {n:7.1f} {n * n - o * o:15.1f}")
    share = (total_new - total_old) / total_new if total_new else float("nan")
    print(
        f"summed over {len(shared)} differences: seed variance {total_old:.1f} -> {total_new:.1f}; "
        f"the redrawn part {total_new - total_old:.1f} ({100 * share:.0f}% of the new design's)"
    )


if __name__ == "__main__":
    main()
