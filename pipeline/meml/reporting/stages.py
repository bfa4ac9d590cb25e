"""Where a study's training spread comes from, stage by stage: this run beside runs of the same grid
and base seed whose seeds retrain less (`report.stages`), its seed variance split into the training
data's draw, pretraining, SFT and RL.

Why: a whole-chain seed (grid.seeds_vary [pretrain, sft, rl]) redraws every stage at once, so its
seed variance is the sum of what the stages add. A run of the same grid whose seeds retrain SFT and
RL only starts every seed's SFT from seed 0's base, and one that retrains RL only starts every
seed's RL from seed 0's SFT models: their seed variances are the spread of the later stages alone.
With s2(.) the seed component of each run's seeds x questions matrix (stats.components):

    pretraining = s2(whole) - s2(sft, rl)     SFT = s2(sft, rl) - s2(rl)     RL = s2(rl)

and, where this run's seeds also redraw the training data (grid.seeds_vary [data, pretrain, sft,
rl]) beside a run whose seeds retrain the whole chain on one data draw (report.stages.pretrain),
data = s2(data, whole) - s2(whole): what a replication's data draw adds to the spread.

each s2 taken before the clip at 0 that the sd columns apply (a clip on each side of a difference
would bias it). The test sample's part is the same in every run (the same questions) and is
reported beside them. Each s2 comes from S seeds (S - 1 degrees of freedom), so a part can come out
negative: that is estimation noise, shown as it is.

The runs must come from the same config but for grid.seeds_vary and profile (the same base seed,
so that their seed 0 is the same chain); that is the user's to keep, since the weights' hashes
match only on the same machine and thread count.

What each run's seeds retrained is read from its files, not trusted from its profile's name: every
RL run's DONE holds the hash of the weights it started from (core/environment.py), one model for
all seeds where seeds retrain RL only; every SFT run's DONE holds the hash of its base, one base for
all seeds where seeds retrain SFT and RL. A run whose files say otherwise stops the report with
the `report.stages` key that named it.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np

from meml.core.io import DataError, read_json
from meml.plan import grid
from meml.plan.layout import Layout
from meml.reporting import stats
from meml.reporting.results import Results
from meml.reporting.tables import MISSING, Table

SCOPES = grid.STAGE_SCOPES  # report.stages key -> what that run's seeds retrain
STAGE_NAMES = {"data": "the training data", "pretrain": "pretraining", "sft": "SFT", "rl": "RL"}


def _start_hash(path: Path, field: str) -> str:
    if not path.is_file():
        raise DataError("run not finished: no DONE file", path, None, field)
    record = read_json(path).get("environment", {})
    if "start_weights_sha256" not in record:
        raise DataError("DONE has no environment.start_weights_sha256 (a run older than the record)", path, None, field)
    return str(record["start_weights_sha256"])


def retrained(cfg: dict[str, Any], folder: Path, field: str) -> list[str]:
    """What the seeds of the run in `folder` retrained, from the hashes of the weights its runs
    started from: RL from one model in every seed -> [rl]; from several, and every seed's SFT from one
    base -> [sft, rl]; from several bases -> [pretrain, sft, rl], and [data, pretrain, sft, rl] where
    the seeds' own worlds hold different training questions."""
    layout, seeds = Layout(folder), cfg["grid"]["seeds"]
    if len(seeds) < 2:
        raise DataError("a stage split needs 2 or more seeds", None, None, "grid.seeds")
    rl_starts: dict[tuple[str, str, str], set[str]] = {}
    for cell in grid.cells(cfg):
        start = _start_hash(layout.rl(cell) / "DONE", field)
        rl_starts.setdefault((cell.model, cell.dataset, cell.method), set()).add(start)

    # the training data: each seed's own world (grid.seeds_vary: data) holds its own draw
    def train_split(ds: str, k: int) -> bytes:
        path = layout.data(cfg["world"], ds, f"seed{k}") / "train.jsonl"
        return path.read_bytes() if path.is_file() else b""

    draws = [{train_split(ds, k) for k in seeds} for ds in cfg["grid"]["datasets"]]
    data = ["data"] if any(len(d) > 1 for d in draws) else []
    if all(len(h) == 1 for h in rl_starts.values()):
        return [*data, "rl"]
    bases: dict[tuple[str, str, str], set[str]] = {}  # (model, data set, variant) -> its seeds' bases
    for model, ds, run in grid.calibrated(cfg):  # every SFT run a cell starts from: e0-e1-e2/seed3
        start = _start_hash(layout.sft(model, ds, run) / "DONE", field)
        bases.setdefault((model, ds, run.partition("/")[0]), set()).add(start)
    return [*data, *(["pretrain", "sft", "rl"] if any(len(h) > 1 for h in bases.values()) else ["sft", "rl"])]


def stage_runs(cfg: dict[str, Any], root: Path) -> list[tuple[list[str], str, Path]]:
    """(what its seeds retrain, profile, results folder) of this run and of each run named in
    report.stages, from the most retrained to the least; every design checked against its files."""
    grid.check_stages(cfg)
    named = cfg["report"]["stages"]
    runs = [(list(cfg["grid"]["seeds_vary"]), cfg["profile"], root, "grid.seeds_vary")]
    for key in ("pretrain", "sft", "rl"):
        if key not in named:
            continue
        field = f"report.stages.{key}"
        folder = root.parent / named[key]
        if not folder.is_dir():
            raise DataError(
                f"no results for '{named[key]}': run this grid with grid.seeds_vary {SCOPES[key]} in that profile",
                folder,
                None,
                field,
            )
        runs.append((SCOPES[key], named[key], folder, field))
    for scope, profile, folder, field in runs:
        found = retrained(cfg, folder, field)
        if set(found) != set(scope):
            raise DataError(
                f"run '{profile}' should retrain {scope} in each seed, but its runs' starting weights say {found}",
                folder,
                None,
                field,
            )
    return [(scope, profile, folder) for scope, profile, folder, _ in runs]


def split(variances: list[float]) -> list[float]:
    """Seed variances of nested runs, most retrained first -> each stage's part: the differences of
    neighbours, and the last run's whole variance (the stage every run retrains)."""
    return [a - b for a, b in itertools.pairwise(variances)] + variances[-1:]


def stage_labels(scopes: list[list[str]]) -> list[str]:
    """The stage(s) each part of `split` belongs to: what a run retrains that the next does not."""
    parts = [[s for s in a if s not in b] for a, b in itertools.pairwise(scopes)] + [scopes[-1]]
    return [" and ".join(STAGE_NAMES[s] for s in part) for part in parts]


def _share(part: float, total: float) -> str:
    return MISSING if total <= 0 else f"{100 * part / total:.0f}%"


def stages_table(cfg: dict[str, Any], root: Path, pairs: list[tuple[str, str]]) -> tuple[Table, list[str]]:
    """The stages table (per cell: each method and each claim's difference) and the index's lines."""
    runs = stage_runs(cfg, root)
    results = [Results(cfg, folder) for _, _, folder in runs]
    scopes = [scope for scope, _, _ in runs]
    labels = stage_labels(scopes)
    table = Table(
        "stages",
        "Where the training spread comes from, stage by stage: runs of this grid whose seeds retrain less",
        ["model", "data set", "accuracy of"],
        [
            ("training sd (points), seeds retrain", [", ".join(s) for s in scopes]),
            ("share of the training variance", labels),
            ("", ["test sd (points)"]),
        ],
    )
    totals: dict[tuple[str, str], list[list[float]]] = {}
    for model in grid.models(cfg):
        for ds in cfg["grid"]["datasets"]:
            # each method's seeds x questions matrix (points) in each run, read once
            named = dict.fromkeys([*grid.methods(cfg), *(m for pair in pairs for m in pair)])
            of = {m: [100 * r.correct(model, ds, m)[1] for r in results] for m in named}
            rows = [(m, of[m]) for m in grid.methods(cfg)]
            rows += [(f"{a} - {b}", [xa - xb for xa, xb in zip(of[a], of[b], strict=True)]) for a, b in pairs]
            for label, matrices in rows:
                parts = [stats.components(x) for x in matrices]
                variances = [c.seed_variance for c in parts]
                shares = split(variances)
                sds, test = [f"{c.seed:.1f}" for c in parts], f"{parts[0].test:.1f}"
                table.add([model, ds, label], sds + [_share(s, variances[0]) for s in shares] + [test])
                if " - " not in label:
                    totals.setdefault((model, ds), []).append([variances[0], *shares])
    seeds, names = len(cfg["grid"]["seeds"]), [profile for _, profile, _ in runs]
    table.notes.append(
        f"Each run: the same grid and base seed; its seeds retrain what its column says ({', '.join(names)}). "
        "Training sd: the seed component of the run's seeds x questions matrix (method of moments, read as 0 when "
        "negative). A stage's share: the drop in seed variance (unclipped) when the seeds stop retraining it, and "
        "for the last stage the last run's whole seed variance, over the first run's. Each "
        f"variance is estimated from {seeds} seeds ({seeds - 1} degrees of freedom), so a share can come out negative "
        "or above 100%: that is estimation noise. Test sd: the first run's spread from the draw of test questions."
    )
    lines = [
        "",
        f"Where the spread comes from, stage by stage (the stages table; runs {', '.join(f'`{n}`' for n in names)}): "
        f"each stage's part of the training variance, summed over the grid's {len(grid.methods(cfg))} methods:",
    ]
    for (model, ds), rows_of_cell in totals.items():
        whole, *summed = np.sum(np.asarray(rows_of_cell), axis=0)
        parts_text = ", ".join(
            f"{label} {_share(float(v), float(whole))}" for label, v in zip(labels, summed, strict=True)
        )
        lines.append(f"- {model} x {ds}: {parts_text}.")
    return table, lines
