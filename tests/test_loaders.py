"""Loaders on hand-written files in the real formats, and bad input naming file, line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meml.core.io import DataError
from meml.core.records import read_records, write_records
from meml.data.loaders import load_hub, load_local, parse_mathqa_options


def write_json(path: Path, obj: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=4))


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


GSM_ROWS = [
    {"question": "How much?", "answer": "It is 5 * $2 = $<<5*2=10>>10.\n#### 10"},
    {"question": "Big?", "answer": "Total 114,200 people.\n#### 114,200"},
    {"question": "Colder?", "answer": "It drops to -10.\n#### -10"},
]
SQA_ROWS = [
    {"qid": "q1", "question": "Is frost common? ", "answer": True, "facts": ["It is cold."], "decomposition": []},
    {"qid": "q2", "question": "Can fish fly?", "answer": False, "facts": ["Fish swim."], "decomposition": []},
    {"qid": "q3", "question": "Is frost common?", "answer": True, "facts": ["Dup."], "decomposition": []},
    {"qid": "q4", "question": "Is the sea salty?", "answer": True, "facts": [], "decomposition": []},
]
MQA_ROW = {
    "Problem": "what is 5 ^ 4 ?",
    "Rationale": '"5 ^ 4 = 625 . answer : c ."',
    "options": "a ) 24 , b ) 120 , c ) 625 , d ) 720 , e ) 1024",
    "correct": "c",
    "annotated_formula": "",
    "linear_formula": "",
    "category": "general",
}


def test_gsm8k_local(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "train.jsonl", GSM_ROWS)
    write_jsonl(tmp_path / "test.jsonl", GSM_ROWS[:1])
    records = load_local("gsm8k", tmp_path)
    assert [r.answer for r in records] == ["10", "114200", "-10", "10"]
    assert [r.split for r in records] == ["train", "train", "train", "test"]
    assert "<<" not in records[0].rationale and records[0].rationale.endswith("#### 10")
    assert records[0].id == "gsm8k-train-00000" and records[3].id == "gsm8k-test-00000"


def test_strategyqa_split_is_deduplicated_and_format_independent(tmp_path: Path) -> None:
    official = tmp_path / "official"
    write_json(official / "train.json", SQA_ROWS[:3])
    write_json(official / "dev.json", SQA_ROWS[3:])
    bigbench = tmp_path / "bigbench"
    examples = [
        {
            "input": r["question"].strip(),
            "target_scores": {"Yes": int(r["answer"]), "No": int(not r["answer"])},
            "target": ("Yes. " if r["answer"] else "No. ") + "because.",
        }
        for r in SQA_ROWS
    ]
    write_json(bigbench / "task.json", {"name": "strategyqa", "examples": examples})
    a = load_local("strategyqa", official, strategyqa_test_size=1)
    b = load_local("strategyqa", bigbench, strategyqa_test_size=1)
    assert len(a) == 3  # the duplicate question (trailing space) is dropped
    assert [(r.id, r.split, r.answer) for r in a] == [(r.id, r.split, r.answer) for r in b]
    assert sum(r.split == "test" for r in a) == 1
    assert all(r.rationale.endswith(("So the answer is yes.", "So the answer is no.")) for r in a)


def test_strategyqa_conflicting_duplicate_is_an_error(tmp_path: Path) -> None:
    rows = [dict(SQA_ROWS[0]), dict(SQA_ROWS[2], answer=False), SQA_ROWS[1]]
    write_json(tmp_path / "train.json", rows)
    write_json(tmp_path / "dev.json", [SQA_ROWS[3]])
    with pytest.raises(DataError, match=r"train.json, record 1, field 'answer'"):
        load_local("strategyqa", tmp_path, strategyqa_test_size=1)


def test_mathqa_uses_dev_as_train_when_train_is_missing(tmp_path: Path) -> None:
    list_shaped = dict(MQA_ROW, options="['a ) 4', 'b ) 4 π', 'c ) 16', 'd ) 8 π', 'e ) 16']", correct="b")
    write_json(tmp_path / "dev.json", [MQA_ROW, list_shaped])
    write_json(tmp_path / "test.json", [MQA_ROW])
    records = load_local("mathqa", tmp_path)
    assert [r.split for r in records] == ["train", "train", "test"]
    assert "(dev)" in records[0].source
    assert records[1].options == {"a": "4", "b": "4 π", "c": "16", "d": "8 π", "e": "16"}
    assert records[0].rationale == "5 ^ 4 = 625 . answer : c"


def test_mathqa_from_the_hubs_parquet_conversion(tmp_path: Path) -> None:
    """allenai/math_qa is a script data set that datasets 5.x will not run; its parquet conversion
    (hub revision refs/convert/parquet, shards named <split>-00000-of-00001.parquet) loads as files."""
    import pandas as pd

    folder = tmp_path / "default"
    folder.mkdir()
    other = dict(MQA_ROW, Problem="what is 2 + 2 ?", Rationale='"2 + 2 = 4 . answer : a"', correct="a",
                 options="a ) 4 , b ) 5 , c ) 6 , d ) 7 , e ) 8")  # fmt: skip
    pd.DataFrame([MQA_ROW, other]).to_parquet(folder / "train-00000-of-00001.parquet")
    pd.DataFrame([other]).to_parquet(folder / "test-00000-of-00001.parquet")
    records = load_local("mathqa", tmp_path)
    assert [(r.split, r.answer) for r in records] == [("train", "c"), ("train", "a"), ("test", "a")]
    assert records[0].rationale == "5 ^ 4 = 625 . answer : c" and records[2].options["a"] == "4"
    assert "train-00000-of-00001.parquet" in records[0].source
    (folder / "test-00000-of-00001.parquet").write_bytes(b"PAR1 torn")
    with pytest.raises(DataError, match=r"test-00000-of-00001\.parquet.*not a readable parquet file"):
        load_local("mathqa", tmp_path)


def test_hub_revision_reaches_the_loader() -> None:
    seen = {}

    def fake(hub_id: str, **kwargs: str) -> dict[str, list[dict]]:
        seen.update(kwargs, hub_id=hub_id)
        return {"train": [MQA_ROW], "test": [MQA_ROW]}

    from meml.core.config import load_config
    from meml.data.loaders import load_real

    settings = load_config()["data"]["mathqa"]
    assert settings["hub_revision"] == "refs/convert/parquet"  # the default: the plain-file copy
    records = load_hub("mathqa", settings["hub_id"], None, load_dataset=fake, revision=settings["hub_revision"])
    assert seen == {"hub_id": "allenai/math_qa", "revision": "refs/convert/parquet"} and len(records) == 2
    assert callable(load_real)


def test_mathqa_option_shapes() -> None:
    assert parse_mathqa_options("a ) a ) 3 , b ) 2 , c ) c ) 5 , d ) d ) 21 , e ) e ) 28")["c"] == "5"
    broken = parse_mathqa_options("a ) 714,240 , b ) 2 , 261,760 , c ) 2 , 400,000 , d ) 3 , 012,121 , e ) 3 , 915,790")
    assert broken["b"] == "2 , 261,760" and broken["e"] == "3 , 915,790"
    assert parse_mathqa_options("a ) $ 180,000 , b ) $ 185,000 , c ) 1 , d ) 2 , e ) 3")["a"] == "$ 180,000"
    with pytest.raises(DataError, match="field 'options'"):
        parse_mathqa_options("a ) 1 , b ) 2")


def test_hub_path_with_injected_loader() -> None:
    def fake_load_dataset(hub_id: str, config: str | None = None) -> dict[str, list[dict]]:
        assert hub_id == "openai/gsm8k" and config == "main"
        return {"train": GSM_ROWS, "test": GSM_ROWS[:2]}

    records = load_hub("gsm8k", load_dataset=fake_load_dataset)
    assert len(records) == 5 and records[-1].source == "openai/gsm8k:test#1"

    def fake_sqa(hub_id: str) -> dict[str, list[dict]]:
        return {"train": SQA_ROWS[:2], "test": SQA_ROWS[3:]}

    assert len(load_hub("strategyqa", load_dataset=fake_sqa, strategyqa_test_size=1)) == 3


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"question": "q"}], r"train.jsonl, line 1, field 'answer'"),
        ([GSM_ROWS[0], {"question": "q", "answer": "x\n#### ten"}], r"train.jsonl, line 2, field 'answer': GSM8K gold"),
        ([GSM_ROWS[0], {"question": "q", "answer": "no gold"}], r"line 2, field 'answer'.*####"),
    ],
)
def test_gsm8k_bad_input(tmp_path: Path, rows: list[dict], message: str) -> None:
    write_jsonl(tmp_path / "train.jsonl", rows)
    write_jsonl(tmp_path / "test.jsonl", GSM_ROWS)
    with pytest.raises(DataError, match=message):
        load_local("gsm8k", tmp_path)


def test_empty_file_and_bad_json(tmp_path: Path) -> None:
    (tmp_path / "train.jsonl").write_text("")
    with pytest.raises(DataError, match=r"train\.jsonl: file is empty"):
        load_local("gsm8k", tmp_path)
    (tmp_path / "train.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n{oops\n')
    with pytest.raises(DataError, match=r"train\.jsonl, line 2: not valid JSON"):
        load_local("gsm8k", tmp_path)


def test_mathqa_bad_field(tmp_path: Path) -> None:
    write_json(tmp_path / "dev.json", [MQA_ROW, dict(MQA_ROW, correct="f")])
    write_json(tmp_path / "test.json", [MQA_ROW])
    with pytest.raises(DataError, match=r"dev.json, record 1, field 'correct'"):
        load_local("mathqa", tmp_path)


def test_unknown_dataset(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="unknown data set 'svamp'"):
        load_local("svamp", tmp_path)


def test_prepared_records_round_trip_and_validation(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "raw" / "train.jsonl", GSM_ROWS)
    write_jsonl(tmp_path / "raw" / "test.jsonl", GSM_ROWS)
    records = load_local("gsm8k", tmp_path / "raw")
    write_records(tmp_path / "out.jsonl", records)
    assert read_records(tmp_path / "out.jsonl") == records
    bad = records[0].to_json() | {"answer": "3.5"}
    write_jsonl(tmp_path / "bad.jsonl", [records[1].to_json(), bad])
    with pytest.raises(DataError, match=r"bad.jsonl, line 2, field 'answer'"):
        read_records(tmp_path / "bad.jsonl")
    missing = {k: v for k, v in records[0].to_json().items() if k != "question"}
    write_jsonl(tmp_path / "missing.jsonl", [missing])
    with pytest.raises(DataError, match=r"missing.jsonl, line 1, field 'question': missing field"):
        read_records(tmp_path / "missing.jsonl")


def test_expert_files_refuse_a_question_twice_and_a_wrong_answer(tmp_path: Path) -> None:
    from meml.data.experts import read_trajectories

    records = load_local("gsm8k", _gsm_folder(tmp_path))
    by_id = {r.id: r for r in records}
    first = records[0]
    good = {"id": first.id, "expert": 1, "completion": "5 * 2 = 10\n#### 10"}
    path = tmp_path / "e1.jsonl"
    write_jsonl(path, [good, good])
    with pytest.raises(DataError, match=r"e1.jsonl, line 2, field 'id'.*appears twice \(first on line 1\)"):
        read_trajectories(path, by_id)
    write_jsonl(path, [good, {"id": records[1].id, "expert": 1, "completion": "so\n#### 7"}])
    with pytest.raises(DataError, match=r"e1.jsonl, line 2, field 'completion'.*checker rejects"):
        read_trajectories(path, by_id)


def _gsm_folder(tmp_path: Path) -> Path:
    write_jsonl(tmp_path / "gsm" / "train.jsonl", GSM_ROWS)
    write_jsonl(tmp_path / "gsm" / "test.jsonl", GSM_ROWS[:1])
    return tmp_path / "gsm"
