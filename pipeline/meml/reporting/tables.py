"""Tables: our numbers beside the paper's, rendered as Markdown and as LaTeX (booktabs).

A table is a stub (the row labels, e.g. model and method) and column groups (e.g. one per data set),
each group holding sub-columns such as ours | paper | diff. Cells are strings; `cell_stats` formats
a list of per-seed values as "mean" or "mean ± sd" (sample standard deviation over seeds).
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from meml.plan import grid

MISSING = "–"
DATASET_TITLES = {"gsm8k": "GSM8K", "strategyqa": "StrategyQA", "mathqa": "MathQA"}
# Said wherever a run's first numbers appear (the report's header, the end message): what to
# expect of them against a committed example on another machine.
SAME_SEED_NOTE = (
    "These numbers repeat to the bit on this machine with the same config, seed, thread count and "
    "versions. On another CPU make or model the float sums round differently and the runs part ways, so "
    "a committed example (report/example/) made elsewhere can differ from yours without either being "
    'wrong: docs/reliability.md, "Same seed, same numbers: where that holds".'
)
TOY_NOTE = (
    "Toy scale: tiny models (about 1M parameters; random, or pretrained for minutes on generated text) "
    "trained for minutes on CPU on "
    "synthetic data sets in the real data sets' formats. Compare the shape of the results with the "
    "paper's, not the values."
)
REAL_MODEL_ON_TOY_NOTE = (
    "Synthetic data: the toy world's data sets, in the real data sets' formats, read by a real pretrained "
    "model through its own tokenizer and chat template. The numbers say what training does to this model "
    "on these problems, not how it does on the real data set."
)


def scale_notes(cfg: dict[str, Any]) -> list[str]:
    """What a reader must know before the numbers: nothing on the real data sets; on the toy world,
    whether the models are the tiny ones built here or a real pretrained model (a `gguf:` source)."""
    if cfg["world"] != "toy":
        return []
    if all(str(cfg["models"][m]["source"]).startswith("tiny:") for m in grid.models(cfg)):
        return [TOY_NOTE]
    return [REAL_MODEL_ON_TOY_NOTE]


# a GGUF file's quantization suffix: SmolLM2-135M-Instruct.Q4_1.gguf, x.IQ3_XS.gguf, x.F16.gguf
_QUANTIZATION = re.compile(r"\.(?:I?Q\d\w*|B?F(?:16|32))$", re.IGNORECASE)


def model_name(source: str) -> str | None:
    """A model's own name, from its source: a hub id's or folder's last part, a GGUF file's name less
    its quantization; None for a tiny model built here (`tiny:`), which has none."""
    if source.startswith("tiny:"):
        return None
    name = PurePosixPath(source.removeprefix("gguf:").rstrip("/")).name
    if source.startswith("gguf:"):
        name = _QUANTIZATION.sub("", name.removesuffix(".gguf"))
    return name


def model_label(cfg: dict[str, Any], model: str) -> str:
    """The paper's model a row compares with, and the model that ran where that is another one: a
    stand-in (SmolLM2-135M-Instruct in Llama-3.2-1B-Instruct's place) is named as what it is."""
    entry = cfg["models"][model]
    paper = entry["paper_name"]
    own = model_name(str(entry["source"]))
    if own is None:  # a tiny model built here (the toy world allows no other)
        return f"{paper} ({'toy' if cfg['world'] == 'toy' else 'tiny'}: {model})"
    return paper if own == paper else f"{own} (as {paper})"


@dataclass
class Table:
    name: str  # file stem under report/<profile>/tables/
    title: str
    stub: list[str]  # header of the row-label columns
    groups: list[tuple[str, list[str]]]  # (group header, sub-column headers)
    rows: list[list[str]] = field(default_factory=list)  # stub cells, then every group's cells
    notes: list[str] = field(default_factory=list)

    def add(self, stub: list[str], cells: list[str]) -> None:
        width = sum(len(sub) for _, sub in self.groups)
        if len(stub) != len(self.stub) or len(cells) != width:
            raise ValueError(f"table {self.name}: row needs {len(self.stub)} labels and {width} cells")
        self.rows.append([*stub, *cells])


def mean_sd(values: list[float]) -> tuple[float, float | None] | None:
    if not values:
        return None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def fmt(values: list[float]) -> str:
    """Per-seed values as "12.3" (one seed) or "12.3 ± 1.0" (mean ± sd over seeds)."""
    stat = mean_sd(values)
    if stat is None:
        return MISSING
    mean, sd = stat
    return f"{mean:.1f}" if sd is None else f"{mean:.1f} ± {sd:.1f}"


def fmt_diff(values: list[float], reference: float | None) -> str:
    """Our mean minus the paper's value, signed."""
    if not values or reference is None:
        return MISSING
    return f"{statistics.fmean(values) - reference:+.1f}"


def fmt_ref(reference: float | None) -> str:
    return MISSING if reference is None else f"{reference:.1f}"


def ours_paper_diff(values: list[float], reference: float | None) -> list[str]:
    return [fmt(values), fmt_ref(reference), fmt_diff(values, reference)]


def to_markdown(table: Table) -> str:
    header = [*table.stub, *(f"{g} {s}".strip() for g, subs in table.groups for s in subs)]
    lines = [f"### {table.title}", ""]
    lines += [f"> {note}" for note in table.notes]
    if table.notes:
        lines.append("")
    lines.append("| " + " | ".join(header) + " |")
    lines.append("| " + " | ".join(["---"] * len(table.stub) + ["---:"] * (len(header) - len(table.stub))) + " |")
    lines += ["| " + " | ".join(row) + " |" for row in table.rows]
    return "\n".join(lines) + "\n"


_LATEX_SPECIAL = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}"}


def latex_escape(text: str) -> str:
    out = "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)
    return out.replace("±", r"$\pm$").replace("–", "--").replace("≥", r"$\geq$")


def to_latex(table: Table) -> str:
    """A booktabs table: a header row of column groups with \\cmidrule under each, then sub-columns."""
    n_stub = len(table.stub)
    widths = [len(subs) for _, subs in table.groups]
    spec = "l" * n_stub + "".join("r" * w for w in widths)
    top = [""] * n_stub + [
        rf"\multicolumn{{{w}}}{{c}}{{{latex_escape(g)}}}" for (g, _), w in zip(table.groups, widths, strict=True)
    ]
    rules, col = [], n_stub + 1
    for w in widths:
        rules.append(rf"\cmidrule(lr){{{col}-{col + w - 1}}}")
        col += w
    sub = [latex_escape(s) for s in table.stub] + [latex_escape(s) for _, subs in table.groups for s in subs]
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        r"\small",
        rf"\caption{{{latex_escape(table.title)}}}",
        rf"\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        " & ".join(top) + r" \\",
        " ".join(rules),
        " & ".join(sub) + r" \\",
        r"\midrule",
    ]
    lines += [" & ".join(latex_escape(c) for c in row) + r" \\" for row in table.rows]
    lines += [r"\bottomrule", r"\end{tabular}"]
    lines += [rf"\par\footnotesize {latex_escape(note)}" for note in table.notes]
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"
