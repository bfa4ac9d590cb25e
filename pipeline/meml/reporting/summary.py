"""The report's written summary: every claim of the paper and every open question (report/claims.yaml)
as a paired difference with a 95% interval and a verdict that the interval earns.

The rule, for a comparison of method A with method B (same questions, same seeds; stats.py):
  - no verdict "at floor" / "at chance" when both sides sit at the floor (under report.stats.floor
    points) or at the data set's chance level (their interval reaches it: 0 for GSM8K, 20% for
    MathQA's five options, the majority class share of the StrategyQA test split);
  - no verdict "one seed" with fewer than report.stats.min_seeds seeds: a single training run
    cannot tell a method's effect from the luck of its seed (the interval shown covers the test
    sample only);
  - otherwise a test: "A beats B" tests difference = 0, "A matches or beats B" tests difference =
    -margin (report.stats.margin), "A differs from B" tests difference = 0 either way. The p-values
    of every test on the page are adjusted together by Holm's method; "supported" or "contradicted"
    only when the adjusted p is below 1 - level (then the interval, which is per comparison, excludes
    the null as well; the converse need not hold), else
    "inconclusive" with the smallest difference this design detects (80% power at the strictest
    Holm level, level / number of tests).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from meml.core.config import PROJECT_ROOT
from meml.core.io import DataError, read_json
from meml.plan import grid
from meml.plan.layout import Layout
from meml.reporting import stats
from meml.reporting.extras import methods_for
from meml.reporting.results import Results, ablation_reference, cells_average, subgroup_share
from meml.reporting.rl_stage import rl_stage_lines


@dataclass
class Comparison:
    text: str
    a: str
    b: str
    claim: str  # ">", ">=" or "!="
    table: str
    estimate: stats.Estimate
    sides: tuple[stats.Estimate, stats.Estimate]
    paper: str = ""
    no_verdict: str | None = None  # why no test was made
    p_adjusted: float | None = None
    verdict: str = ""


def load_claims(path: str | Path) -> dict[str, list[dict[str, Any]]]:
    file = Path(path)
    if not file.is_absolute() and not file.is_file():
        file = PROJECT_ROOT / file  # a workflow-relative default, run from elsewhere
    if not file.is_file():
        raise DataError("claims file not found", file, None, "report.claims")
    data = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
    for section in ("claims", "questions"):
        for i, entry in enumerate(data.get(section) or []):
            needed = {"text", "b", "claim", "table"} | ({"a"} if "each_of_table" not in entry else set())
            if needed - set(entry) or entry.get("claim") not in (">", ">=", "!="):
                message = f"a claim needs text, a, b, claim (>, >= or !=) and table; got {entry}"
                raise DataError(message, file, None, f"{section}[{i}]")
    return {"claims": data.get("claims") or [], "questions": data.get("questions") or []}


class Summary:
    """Builds the comparisons of one run from its results, then renders them."""

    def __init__(self, cfg: dict[str, Any], results: Results, reference: dict[str, Any]) -> None:
        self.cfg, self.results, self.reference = cfg, results, reference
        self.settings = cfg["report"]["stats"]
        self.seeds = len(cfg["grid"]["seeds"])

    # ---------------------------------------------------------------- measuring one comparison

    def scope(self, entry: dict[str, Any]) -> tuple[list[str], list[str]]:
        if entry.get("scope", "grid") == "extras":
            return grid.extra_models(self.cfg), self.cfg["extras"]["datasets"]
        return grid.models(self.cfg), self.cfg["grid"]["datasets"]

    def _matrix(self, model: str, ds: str, method: str, measure: str) -> tuple[list[str] | None, np.ndarray]:
        """(question ids, values[seed, question] in points); the final reward has one value a seed."""
        if measure == "final_reward":  # the last 3 steps' mean training reward, x100
            rows = [self.results.steps(model, ds, method, s)[-3:] for s in self.cfg["grid"]["seeds"]]
            return None, np.array([[100 * statistics.fmean(r["reward/mean"] for r in tail)] for tail in rows])
        ids, correct = self.results.correct(model, ds, method, "vote" if measure == "vote" else None)
        return ids, 100 * correct

    def compare(self, entry: dict[str, Any]) -> Comparison:
        models, datasets = self.scope(entry)
        a, b = entry["a"], entry["b"]
        measure_a = entry.get("measure", "accuracy")
        measure_b = entry.get("b_measure", measure_a)
        cells_a, cells_b, chances = [], [], []
        for model in models:
            for ds in datasets:
                (ids_a, xa), (ids_b, xb) = self._matrix(model, ds, a, measure_a), self._matrix(model, ds, b, measure_b)
                if ids_a != ids_b:
                    raise DataError(f"{a} and {b} were evaluated on different questions ({model}/{ds}): not paired")
                cells_a.append(xa)
                cells_b.append(xb)
                chances.append(0.0 if measure_a == "final_reward" else self.results.chance(model, ds, a))
        diffs = [xa - xb for xa, xb in zip(cells_a, cells_b, strict=True)]
        comparison = Comparison(
            entry["text"], a, b if measure_b != "vote" else f"{b} (vote)", entry["claim"], entry["table"],
            cells_average(self.cfg, models, diffs),
            (cells_average(self.cfg, models, cells_a), cells_average(self.cfg, models, cells_b)),
            self.paper(entry, models, datasets),
        )  # fmt: skip
        comparison.no_verdict = self._no_verdict(comparison, statistics.fmean(chances), measure_a)
        return comparison

    def _no_verdict(self, c: Comparison, chance: float, measure: str) -> str | None:
        level, floor = self.settings["level"], self.settings["floor"]

        def low(side: stats.Estimate) -> str | None:
            if side.mean < floor:
                return "at floor"
            if measure != "final_reward" and side.has_interval and side.interval(level)[0] <= chance:
                return "at floor" if chance == 0 else "at chance"
            return None

        sides = [low(s) for s in c.sides]
        if sides[0] and sides[1]:
            return sides[0] if sides[0] == sides[1] else "at floor or chance"
        if self.seeds < self.settings["min_seeds"]:
            return f"{self.seeds} seed{'s' if self.seeds != 1 else ''}"
        if not c.estimate.has_interval:
            return "no interval"
        return None

    def paper(self, entry: dict[str, Any], models: list[str], datasets: list[str]) -> str:
        """The paper's own numbers for the two methods, averaged like ours, when it reports them."""
        names = [self.cfg["models"][m]["paper_name"] for m in models]
        if entry["table"] == "main":
            main = self.reference.get("main", {})
            pair = (entry["a"], entry["b"])
            values = [[main.get(n, {}).get(m, {}).get(ds) for n in names for ds in datasets] for m in pair]
        elif entry["table"] == "ablation":
            values = [
                [ablation_reference(self.reference, self.cfg, m).get(n) for n in names]
                for m in (entry["a"], entry["b"])
            ]
        else:
            return ""
        if any(v is None for side in values for v in side):
            return ""
        pa, pb = statistics.fmean(values[0]), statistics.fmean(values[1])  # type: ignore[arg-type]
        return f"paper: {pa:.1f} vs {pb:.1f}, {pa - pb:+.1f}"

    # ---------------------------------------------------------------- the page

    def entries(self, claims: dict[str, list[dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
        """(section, entry) for every claim and question this run can answer, each_of_table expanded."""
        used = set(grid.used_methods(self.cfg))
        out = []
        for section in ("claims", "questions"):
            for entry in claims[section]:
                if "each_of_table" in entry:
                    expanded = [
                        {**entry, "a": m, "text": f"{entry['text']} ({m})"}
                        for m in methods_for(self.cfg, entry["each_of_table"])  # the table decides its members
                        if m != entry["b"]
                    ]
                else:
                    expanded = [entry]
                out += [(section, e) for e in expanded if {e["a"], e["b"]} <= used]
        return out

    def line(self, c: Comparison) -> str:
        level = self.settings["level"]
        a, b = c.sides
        est = c.estimate
        if est.has_interval:
            lo, hi = est.interval(level)
            diff = f"difference {est.mean:+.1f} [{100 * level:.0f}% CI {lo:+.1f}, {hi:+.1f}]"
        else:
            diff = f"difference {est.mean:+.1f} (no interval)"
        p = ""
        if c.p_adjusted is not None:
            p = ", Holm p < 0.001" if c.p_adjusted < 0.001 else f", Holm p = {c.p_adjusted:.3f}"
        paper = f"; {c.paper}" if c.paper else ""
        where = f"{c.table} table{paper}"
        return f"- {c.text} ({where}): {c.a} {a.mean:.1f} vs {c.b} {b.mean:.1f}, {diff}{p}. **{c.verdict}**."


def decide(comparisons: list[Comparison], settings: dict[str, Any]) -> None:
    """Holm over the tests on the page, then the verdict words (report.stats: level, margin)."""
    alpha, margin = 1 - settings["level"], settings["margin"]
    tested = [c for c in comparisons if c.no_verdict is None]
    nulls = [-margin if c.claim == ">=" else 0.0 for c in tested]
    adjusted = stats.holm([c.estimate.p_value(null) for c, null in zip(tested, nulls, strict=True)])
    for c, p, null in zip(tested, adjusted, nulls, strict=True):
        c.p_adjusted = p
        if p >= alpha:
            mde = c.estimate.detectable(alpha / len(tested))
            c.verdict = f"inconclusive (this design detects about ±{mde:.1f} points)"
        elif c.claim == "!=":
            c.verdict = "supported"
        else:
            c.verdict = "supported" if c.estimate.mean > null else "contradicted"
    for c in comparisons:
        if c.no_verdict is not None:
            c.verdict = f"no verdict ({c.no_verdict})"


# a run's claims and questions decided: the summary, its entries (section, claim), their comparisons
Decision = tuple[Summary, list[tuple[str, dict[str, Any]]], list[Comparison]]


def decided(cfg: dict[str, Any], results: Results, reference: dict[str, Any]) -> Decision:
    """The run's claims and questions, compared and decided (Holm over the page)."""
    summary = Summary(cfg, results, reference)
    entries = summary.entries(load_claims(cfg["report"]["claims"]))
    comparisons = [summary.compare(e) for _, e in entries]
    decide(comparisons, summary.settings)
    return summary, entries, comparisons


def as_record(c: Comparison, level: float) -> dict[str, Any]:
    """One decided comparison as the report's claims.json holds it (what the README's table reads)."""
    est = c.estimate
    low, high = est.interval(level) if est.has_interval else (None, None)
    return {
        "text": c.text, "a": c.a, "b": c.b, "table": c.table, "paper": c.paper,
        "a_mean": c.sides[0].mean, "b_mean": c.sides[1].mean,
        "difference": est.mean, "low": low, "high": high, "level": level,
        "p_adjusted": c.p_adjusted, "verdict": c.verdict,
    }  # fmt: skip


def render(cfg: dict[str, Any], results: Results, root: Path, decision: Decision) -> list[str]:
    """Markdown lines: how to read the verdicts, the claims, the regime, the open questions
    (`decision`: what `decided` returned, the claims.json's comparisons too)."""
    summary, entries, comparisons = decision
    s = summary.settings
    tests = sum(c.p_adjusted is not None for c in comparisons)
    models, datasets = grid.models(cfg), cfg["grid"]["datasets"]
    lines = [
        f"Accuracy: expert {cfg['report']['headline_expert']}'s prompt ({results.metric} checker), averaged over "
        f"{', '.join(models)} x {', '.join(datasets)}; {summary.seeds} seed(s). Each line: the paired difference "
        + (
            f"(same seeds, each on its own world's test questions) with a {100 * s['level']:.0f}% interval over the "
            "seeds (the t-interval of the seeds' means, each carrying its world, training and test draw: docs/grid.md, "
            "Seeds); "
            if results.nested
            else f"(same questions, same seeds) with a {100 * s['level']:.0f}% interval over seeds and questions "
            "(crossed random effects, t with Satterthwaite's df: docs/grid.md, Verdicts); "
        )
        + f"{tests} of {len(comparisons)} comparisons tested, p-values adjusted together (Holm). A verdict needs the "
        f"adjusted p below {1 - s['level']:.2f} (each interval is for its own comparison, so with several tests "
        "one can exclude 0 and still be inconclusive); "
        f"'matches' means within {s['margin']} points; no verdict at floor or chance, or with fewer than "
        f"{s['min_seeds']} seeds. {results.cut_note()}",
    ]
    sections = {"claims": "The paper's claims:", "questions": "The open questions (extras):"}
    for section, title in sections.items():
        chosen = [c for (sec, _), c in zip(entries, comparisons, strict=True) if sec == section]
        if chosen:
            lines += ["", title, *(summary.line(c) for c in chosen)]
        elif section == "questions":
            lines += ["", "The open questions need the extras (`config/toy-seeds.yaml`); this run has none."]
    lines += ["", "The regime (descriptive, no verdict):", *_regime_lines(cfg, results, root)]
    lines += ["", *rl_stage_lines(cfg, results, root)]
    lines += _spread_lines(summary, spread_pairs(entries))
    return lines


def spread_pairs(entries: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, str]]:
    """The (a, b) method pairs of the claims whose spread is reported: grid methods, accuracy on
    both sides (a difference of two seeds x questions matrices), each pair once."""
    paired = [
        (e["a"], e["b"])
        for _, e in entries
        if e.get("scope", "grid") == "grid"
        and e.get("measure", "accuracy") == e.get("b_measure", "accuracy") == "accuracy"
    ]
    return list(dict.fromkeys(paired))


def _spread_lines(summary: Summary, pairs: list[tuple[str, str]]) -> list[str]:
    """Where the spread comes from: for each grid method and each claim's difference, the sd of one
    run's accuracy across seeds (training) and across draws of the test questions, per cell. What
    the seed sd contains is what grid.seeds_vary retrains; a run with seeds_vary [rl] beside one with
    [pretrain, sft, rl] splits it into RL and the stages before (docs/grid.md, The toy study)."""
    cfg = summary.cfg
    if len(cfg["grid"]["seeds"]) < 2:
        return []
    vary = ", ".join(cfg["grid"]["seeds_vary"])
    nested = summary.results.nested
    if nested:
        data = "each seed draws a world of its own, its test questions too). "
    elif grid.varies(cfg, "data"):
        data = "each seed draws its own training data, the test questions are shared). "
    else:
        data = "the data are the same for every seed). "
    lines = [
        "",
        f"Where the spread comes from (a seed retrains: {vary}; {data}"
        "Standard deviation of one run's accuracy, in points: across seeds (training"
        + (" and the world" if nested else "")
        + ") and across draws of the test questions (method of moments on the seeds x questions matrix, per cell"
        + (", the questions nested in the seeds" if nested else "")
        + "):",
    ]
    models, datasets = grid.models(cfg), cfg["grid"]["datasets"]
    for model in models:
        for ds in datasets:
            parts = []
            for method in grid.methods(cfg):
                c = stats.components(summary._matrix(model, ds, method, "accuracy")[1], nested)
                parts.append(f"{method} {c.seed:.1f} / {c.test:.1f}")
            lines.append(f"- {model} x {ds}, training / test: {'; '.join(parts)}.")
            for a, b in pairs:
                d = stats.components(
                    summary._matrix(model, ds, a, "accuracy")[1] - summary._matrix(model, ds, b, "accuracy")[1], nested
                )
                lines.append(f"  - {a} - {b}: training {d.seed:.1f}, test {d.test:.1f}.")
    return lines


def _regime_lines(cfg: dict[str, Any], results: Results, root: Path) -> list[str]:
    lines = []
    used = set(grid.used_methods(cfg))
    if "MoE-SFT-GRPO" in used:
        models, datasets = grid.models(cfg), cfg["grid"]["datasets"]
        share = subgroup_share("all_wrong")

        def per_seed(model: str, ds: str) -> np.ndarray:  # seeds x 1: one value per run
            runs = [results.steps(model, ds, "MoE-SFT-GRPO", s) for s in cfg["grid"]["seeds"]]
            return np.array([[100 * statistics.fmean(share(r) for r in rows)] for rows in runs])

        est = cells_average(cfg, models, [per_seed(m, ds) for m in models for ds in datasets])
        band = "" if not est.has_interval else " [95% CI {:.1f}, {:.1f} over seeds]".format(*est.interval())
        lines.append(
            f"- Reward sparsity (the paper's motivation: most subgroups get no signal): {est.mean:.1f}%{band} of "
            "MoE-SFT-GRPO's (question, expert) subgroups are all wrong, mean over steps."
        )
    lines += _complementarity_lines(cfg, root)
    lines += _mechanism_lines(cfg, results)
    return lines


def _mechanism_lines(cfg: dict[str, Any], results: Results) -> list[str]:
    """How often IML and HSFT fired, and how much dynamic sampling replaced, per run."""

    def per_run(switch: str, value: Any) -> list[float]:
        runs = [
            results.steps(c.model, c.dataset, c.method, c.seed)
            for c in grid.cells(cfg)
            if cfg["methods"][c.method].get(switch)
        ]
        return [value(rows) for rows in runs if rows]

    iml = per_run("iml", lambda rows: sum(r["iml/pairs"] for r in rows))
    hsft = per_run("hsft", lambda rows: rows[-1]["hsft/flushes"])
    parts = []
    if iml:
        parts.append(f"IML formed {statistics.fmean(iml):.1f} pairs per run (range {min(iml):.0f}-{max(iml):.0f})")
    if hsft:
        parts.append(
            f"HSFT flushed its buffer {statistics.fmean(hsft):.1f} times per run "
            f"(range {min(hsft):.0f}-{max(hsft):.0f})"
        )
    replaced = per_run("dynamic_sampling", lambda rows: statistics.fmean(r.get("dynamic/replaced", 0.0) for r in rows))
    if replaced:
        q = cfg["rl"]["questions_per_step"]
        parts.append(f"dynamic sampling drew {statistics.fmean(replaced):.1f} replacement questions a step for its {q}")
    return [f"- The mechanisms (sparsity table and figures): {'; '.join(parts)}."] if parts else []


def _complementarity_lines(cfg: dict[str, Any], root: Path) -> list[str]:
    """The motivation figure's number: the paper has more than 60% of one expert's errors solved by
    another expert in the same draw (GSM8K). One sampling run: a figure, not a verdict."""
    solved, any_right = [], []
    for model in grid.complementarity_models(cfg):
        for ds in cfg["grid"]["datasets"]:
            s = read_json(Layout(root).complementarity(model, ds))
            solved += [100 * v for v in s["solved_by_another"].values() if v is not None]
            any_right.append(100 * s["at_least_one_correct"])
    if not solved:
        return []
    return [
        f"- Complementarity (the paper: more than 60% of one expert's errors solved by another): "
        f"{statistics.fmean(solved):.1f}% here, mean over experts and data sets; at least one expert right in "
        f"{statistics.fmean(any_right):.1f}% of draws (one sampling run after MEF)."
    ]
