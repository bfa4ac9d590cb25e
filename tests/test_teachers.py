"""Teacher trajectories against a scripted OpenAI-compatible server on 127.0.0.1 (no other network):
rejection sampling, retries with backoff, failures recorded, resume, secrets, bring-your-own files."""

from __future__ import annotations

import json
import shutil
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from meml.core.io import DataError
from meml.core.records import Record, read_records
from meml.data.teachers import (
    DEFAULTS,
    Reply,
    ServedModelChanged,
    TransientError,
    build_expert,
    generate,
    teacher_key,
)

SECRET = "sk-test-SECRET-4242"


class Script:
    """What the server answers: `plan(question, n)` for the n-th request about a question returns
    ("ok", answer, reasoning) | ("status", code) | ("malformed",) | ("sleep", seconds)."""

    def __init__(self, plan: Callable[[str, int], tuple[Any, ...]]) -> None:
        self.plan = plan
        self.requests: Counter[str] = Counter()
        self.auth: list[str] = []
        self.lock = threading.Lock()
        self.served: str | None = None  # the model the replies name (None: they name none)


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Script]]:
    """The scripted API, and its key in the environment variable the settings name."""
    monkeypatch.setenv("TEST_TEACHER_KEY", SECRET)
    script = Script(lambda q, n: ("ok", "0", ""))

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # keep pytest output quiet
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            question = body["messages"][-1]["content"]
            with script.lock:
                script.requests[question] += 1
                script.auth.append(self.headers.get("Authorization", ""))
                n = script.requests[question]
            action = script.plan(question, n)
            if action[0] == "sleep":
                import time

                time.sleep(action[1])
                action = ("ok", action[2], "")
            if action[0] == "status":
                payload = f"error for {self.headers.get('Authorization')}".encode()  # a server that echoes the key
                self.send_response(action[1])
            elif action[0] == "malformed":
                payload = b"{not json"
                self.send_response(200)
            else:
                message = {"role": "assistant", "content": f"Adding it up gives {action[1]}.\n#### {action[1]}"}
                if action[2]:
                    message["reasoning_content"] = action[2]
                reply = {"choices": [{"message": message}], "usage": {"total_tokens": 7}}
                payload = json.dumps({**reply, **({"model": script.served} if script.served else {})}).encode()
                self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", script
    httpd.shutdown()


def _settings(url: str, **changes: Any) -> dict[str, Any]:
    return {**DEFAULTS, "backend": "openai", "base_url": url, "model": "r1", "api_key_env": "TEST_TEACHER_KEY",
            "timeout": 2.0, "backoff_base": 0.0, "backoff_max": 0.0, "concurrency": 3, **changes}  # fmt: skip


@pytest.fixture
def records(small_world: Path) -> list[Record]:
    return read_records(small_world / "data/gsm8k/train.jsonl")[:6]


def _gold(records: list[Record]) -> dict[str, str]:
    return {r.question: r.answer for r in records}


def test_rejection_sampling_keeps_only_accepted_answers(
    server: tuple[str, Script], records: list[Record], tmp_path: Path
) -> None:
    url, script = server
    gold = _gold(records)
    q_late, q_never, q_think = records[0].question, records[1].question, records[2].question

    def plan(q: str, n: int) -> tuple[Any, ...]:
        if q == q_late:
            return ("ok", gold[q] if n == 3 else "99999", "")  # right on the third try
        if q == q_never:
            return ("ok", "99999", "")  # never right
        return ("ok", gold[q], "Let me think. 2 and 2." if q == q_think else "")

    script.plan = plan
    settings = _settings(url, max_attempts=4)
    summary = build_expert(
        _data(tmp_path, records), "gsm8k", 1, settings, tmp_path / "experts", tmp_path / "cache", progress=False
    )
    assert script.requests[q_late] == 3 and script.requests[q_never] == 4 and script.requests[q_think] == 1
    assert summary["questions_with_trajectory"] == 5 and summary["attempted"] == 3 + 4 + 4
    assert summary["acceptance_rate"] == round(5 / 11, 4)
    rows = [json.loads(x) for x in (tmp_path / "experts/e1.jsonl").read_text().splitlines()]
    assert records[1].id not in {r["id"] for r in rows}
    think = next(r for r in rows if r["id"] == records[2].id)["completion"]
    assert think.startswith("<think>\nLet me think. 2 and 2.\n</think>\n") and think.endswith(
        f"#### {records[2].answer}"
    )
    cache = [json.loads(x) for x in (tmp_path / "cache/gsm8k/e1.jsonl").read_text().splitlines()]
    late = [r for r in cache if r["id"] == records[0].id]
    assert [r["status"] for r in late] == ["rejected", "rejected", "accepted"] and late[-1]["attempt"] == 3
    assert late[-1]["teacher"]["model"] == "r1" and late[-1]["tokens"] == 7 and "time" in late[-1]
    assert all(a == f"Bearer {SECRET}" for a in script.auth)


def _data(tmp: Path, records: list[Record]) -> Path:
    from meml.core.records import write_records

    write_records(tmp / "data/train.jsonl", records)
    return tmp / "data"


def test_transient_errors_are_retried_then_recorded_and_the_run_goes_on(
    server: tuple[str, Script], records: list[Record], tmp_path: Path
) -> None:
    url, script = server
    gold = _gold(records)
    first: dict[str, tuple[Any, ...]] = {
        records[0].question: ("status", 429),  # twice, then fine
        records[1].question: ("malformed",),
        records[2].question: ("sleep", 3.0, gold[records[2].question]),  # longer than the 2 s timeout
    }
    broken = records[3].question  # 503 for ever

    def plan(q: str, n: int) -> tuple[Any, ...]:
        if q == broken:
            return ("status", 503)
        if q in first and (n == 1 or (q == records[0].question and n == 2)):
            return first[q]
        return ("ok", gold[q], "")

    script.plan = plan
    waits: list[float] = []
    settings = _settings(url, retries=3, backoff_base=0.5, backoff_max=1.0)
    counts = generate(records, 1, settings, tmp_path / "cache.jsonl", sleep=waits.append, progress=False)
    assert counts["accepted"] == 5 and counts["failed"] == 1
    assert script.requests[records[0].question] == 3 and script.requests[records[3].question] == 4  # 1 + 3 retries
    # backoff doubles per retry (0.5, 1.0, then capped at 1.0), times a jitter in [0.5, 1.5)
    assert len(waits) == 2 + 1 + 1 + 3 and all(0.25 <= w < 1.5 for w in waits)
    failed = [json.loads(x) for x in (tmp_path / "cache.jsonl").read_text().splitlines() if '"failed"' in x]
    assert [r["id"] for r in failed] == [records[3].id] and "HTTP 503" in failed[0]["error"]
    assert SECRET not in (tmp_path / "cache.jsonl").read_text()  # the server echoed the key; it was scrubbed
    # the next run asks again only for the failed item
    script.plan = lambda q, n: ("ok", gold[q], "")
    before = sum(script.requests.values())
    again = generate(records, 1, settings, tmp_path / "cache.jsonl", sleep=waits.append, progress=False)
    assert again["requested_items"] == 1 and sum(script.requests.values()) == before + 1


class KilledTeacher:
    """Answers `live` requests correctly, then the process 'dies' (KeyboardInterrupt)."""

    def __init__(self, gold: dict[str, str], live: int) -> None:
        self.gold, self.live, self.asked = gold, live, Counter[str]()
        self.lock = threading.Lock()

    def scrub(self, text: str) -> str:
        return text

    def ask(self, messages: list[dict[str, str]]) -> Reply:
        question = messages[-1]["content"]
        with self.lock:
            if self.live <= 0:
                raise KeyboardInterrupt
            self.live -= 1
            self.asked[question] += 1
        return Reply(f"#### {self.gold[question]}", "", 1)


def test_a_killed_run_restarted_asks_only_for_unfinished_items(records: list[Record], tmp_path: Path) -> None:
    settings = {**DEFAULTS, "backend": "openai", "base_url": "unused", "model": "m", "concurrency": 1}
    gold = _gold(records)
    with pytest.raises(KeyboardInterrupt):
        generate(records, 2, settings, tmp_path / "c.jsonl", teacher=KilledTeacher(gold, live=4), progress=False)
    done = {json.loads(x)["id"] for x in (tmp_path / "c.jsonl").read_text().splitlines()}
    assert len(done) == 4
    second = KilledTeacher(gold, live=100)
    counts = generate(records, 2, settings, tmp_path / "c.jsonl", teacher=second, progress=False)
    assert counts["requested_items"] == 2 and sum(second.asked.values()) == 2
    assert {r.question for r in records if r.id not in done} == set(second.asked)
    # another teacher config is another cache key: nothing is reused
    assert teacher_key({**settings, "temperature": 0.3}) != teacher_key(settings)
    assert teacher_key({**settings, "timeout": 5}) == teacher_key(settings)


def test_teach_command_never_leaks_the_key(
    server: tuple[str, Script],
    records: list[Record],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from meml.cli import main

    url, script = server
    monkeypatch.chdir(tmp_path)
    gold = _gold(records)
    script.plan = lambda q, n: ("status", 500) if q == records[0].question else ("ok", gold[q], "")
    data = tmp_path / "results/p/real/data/gsm8k"
    _data(tmp_path, records)
    data.mkdir(parents=True)
    shutil.copy(tmp_path / "data/train.jsonl", data / "train.jsonl")
    teacher = {"backend": "openai", "base_url": url, "model": "r1", "api_key_env": "TEST_TEACHER_KEY",
               "retries": 1, "backoff_base": 0.0, "timeout": 2.0}  # fmt: skip
    sections = {"profile": "p", "teachers": {"e1": teacher},
                "mlflow": {"enabled": True, "tracking_uri": f"sqlite:///{tmp_path}/ml.db", "experiment": "p",
                           "artifacts": str(tmp_path / "art")}}  # fmt: skip
    # a question that failed on every retry: the job fails (no output: the workflow will run it again)
    assert main(["teach", "--dataset", "gsm8k", "--expert", "1", "--config-json", json.dumps(sections)]) == 2
    first = capsys.readouterr()
    assert "1 of 6 questions got no reply from teacher e1" in first.err
    assert not (tmp_path / "results/p/real/experts/gsm8k/e1.jsonl").exists()
    script.plan = lambda q, n: ("ok", gold[q], "")  # the API is back: the rerun asks that question alone
    assert main(["teach", "--dataset", "gsm8k", "--expert", "1", "--config-json", json.dumps(sections)]) == 0
    out = capsys.readouterr()
    assert "6 of 6 questions" in out.out
    assert (tmp_path / "results/p/real/experts/gsm8k/e1.stats.json").is_file()
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in out.out + out.err + first.out + first.err
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/ml.db")
    [run] = mlflow.search_runs(experiment_names=["p"], output_format="list")
    assert run.data.tags["teacher_model"] == "r1" and run.data.params["teacher.api_key_env"] == "TEST_TEACHER_KEY"
    assert SECRET not in json.dumps(run.data.params) + json.dumps(run.data.tags)


def test_a_refused_request_names_no_key(server: tuple[str, Script], records: list[Record], tmp_path: Path) -> None:
    url, script = server
    script.plan = lambda q, n: ("status", 401)
    with pytest.raises(DataError, match="HTTP 401") as err:
        generate(records[:1], 1, _settings(url), tmp_path / "c.jsonl", progress=False)
    assert SECRET not in str(err.value) and "***" in str(err.value)


def test_missing_key_variable_is_named(records: list[Record], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TEST_TEACHER_KEY", raising=False)
    with pytest.raises(DataError, match="TEST_TEACHER_KEY is not set"):
        generate(records, 1, _settings("http://127.0.0.1:9/v1"), tmp_path / "c.jsonl", progress=False)


def test_bring_your_own_file_is_validated(records: list[Record], tmp_path: Path) -> None:
    data = _data(tmp_path, records)
    own = tmp_path / "own/gsm8k"
    own.mkdir(parents=True)
    good = [{"id": r.id, "expert": 1, "completion": f"Sum.\n#### {r.answer}"} for r in records[:3]]
    wrong_answer = {"id": records[3].id, "expert": 1, "completion": "#### 99999"}
    (own / "e1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in [*good, wrong_answer]))
    settings = {**DEFAULTS, "backend": "jsonl", "path": str(tmp_path / "own")}
    summary = build_expert(data, "gsm8k", 1, settings, tmp_path / "experts", tmp_path / "cache", progress=False)
    assert summary["accepted"] == 3 and summary["attempted"] == 4  # the wrong answer is dropped
    (own / "e1.jsonl").write_text(json.dumps(good[0]) + "\n" + json.dumps({"id": records[1].id, "expert": 1}) + "\n")
    with pytest.raises(DataError, match=r"e1.jsonl, line 2, field 'completion'"):
        build_expert(data, "gsm8k", 1, settings, tmp_path / "experts", tmp_path / "cache", progress=False)


class BatchTeacher:
    """A stand-in for the vLLM teacher's batch mode: right only on the second round."""

    def __init__(self, gold: dict[str, str]) -> None:
        self.gold, self.rounds = gold, []

    def scrub(self, text: str) -> str:
        return text

    def ask_many(self, conversations: list[list[dict[str, str]]]) -> list[Reply]:
        self.rounds.append(len(conversations))
        right = len(self.rounds) == 2
        return [Reply(f"#### {self.gold[c[-1]['content']] if right else 99999}", "", 3) for c in conversations]


def test_batch_mode_asks_each_round_once_for_what_is_unfinished(records: list[Record], tmp_path: Path) -> None:
    settings = {**DEFAULTS, "backend": "vllm", "model": "m", "max_attempts": 3}
    teacher = BatchTeacher(_gold(records))
    counts = generate(records, 1, settings, tmp_path / "c.jsonl", teacher=teacher, progress=False)
    assert teacher.rounds == [6, 6] and counts["accepted"] == 6 and counts["rejected"] == 6


def test_a_key_echoed_in_a_successful_reply_is_never_written(
    server: tuple[str, Script], records: list[Record], tmp_path: Path
) -> None:
    url, script = server
    gold = _gold(records)
    script.plan = lambda q, n: ("ok", gold[q], f"my key is {SECRET}, as you sent it")
    data = _data(tmp_path, records)
    build_expert(data, "gsm8k", 1, _settings(url), tmp_path / "experts", tmp_path / "cache", progress=False)
    written = [p for p in tmp_path.rglob("*") if p.is_file() and "data" not in p.parts]
    assert written and all(SECRET.encode() not in p.read_bytes() for p in written)
    assert "***" in (tmp_path / "experts/e1.jsonl").read_text()  # the reasoning kept, the key masked


class FlakyTeacher(KilledTeacher):
    """Fails every try on the questions in `down` (as an API that keeps answering 503)."""

    def __init__(self, gold: dict[str, str], down: set[str]) -> None:
        super().__init__(gold, live=10**6)
        self.down = down

    def ask(self, messages: list[dict[str, str]]) -> Reply:
        if messages[-1]["content"] in self.down:
            raise TransientError("HTTP 503")
        return super().ask(messages)


def test_a_question_that_failed_is_asked_again_on_the_next_run(records: list[Record], tmp_path: Path) -> None:
    """A failed question leaves no output, so the workflow reruns the job; the rerun asks that
    question alone and writes the expert's trajectories."""
    settings = {**DEFAULTS, "backend": "openai", "base_url": "unused", "model": "m", "concurrency": 1, "retries": 0}
    gold, data = _gold(records), _data(tmp_path, records)
    first = FlakyTeacher(gold, down={records[2].question})
    with pytest.raises(DataError, match=r"1 of 6 questions got no reply from teacher e1"):
        build_expert(data, "gsm8k", 1, settings, tmp_path / "out", tmp_path / "cache", teacher=first, progress=False)
    assert not (tmp_path / "out/e1.jsonl").exists()
    second = FlakyTeacher(gold, down=set())
    summary = build_expert(data, "gsm8k", 1, settings, tmp_path / "out", tmp_path / "cache", teacher=second,
                           progress=False)  # fmt: skip
    assert dict(second.asked) == {records[2].question: 1} and summary["questions_with_trajectory"] == 6
    assert (tmp_path / "out/e1.jsonl").is_file()


def test_a_change_of_the_model_behind_the_teachers_name_is_reported_not_mixed(
    server: tuple[str, Script], records: list[Record], tmp_path: Path
) -> None:
    """The cache keeps the model each reply names. When the API starts answering the configured name
    (an alias) with another model, the job stops after the first such reply (kept), naming both models,
    and stops again at once on a rerun; pinning the old model keeps every cached answer and asks only
    the rest, while a pin of the new one would start the expert over under it."""
    url, script = server
    gold = _gold(records)
    script.plan = lambda q, n: ("ok", gold[q], "")
    script.served = "r1-0120"
    alias = _settings(url, model="r1", concurrency=1)
    data, cache = _data(tmp_path, records[:4]), tmp_path / "cache"
    summary = build_expert(data, "gsm8k", 1, alias, tmp_path / "experts", cache, progress=False)
    assert summary["served_models"] == ["r1-0120"]
    rows = [json.loads(x) for x in (cache / "gsm8k/e1.jsonl").read_text().splitlines()]
    assert {r["served_model"] for r in rows} == {"r1-0120"}
    script.served = "r1-0528"  # the provider repoints the alias
    data = _data(tmp_path, records)  # two more questions to ask
    with pytest.raises(ServedModelChanged) as err:
        build_expert(data, "gsm8k", 1, alias, tmp_path / "experts", cache, progress=False)
    message = str(err.value)
    assert "'r1-0528'" in message and "4 cached answers came from 'r1-0120'" in message, message
    assert err.value.field == "teachers.e1.model" and sum(script.requests.values()) == 4 + 1
    with pytest.raises(ServedModelChanged):  # the rerun stops before it asks
        build_expert(data, "gsm8k", 1, alias, tmp_path / "experts", cache, progress=False)
    assert sum(script.requests.values()) == 5
    script.served = "r1-0120"  # the API still serves the old model by its own name: pin it
    pinned = build_expert(data, "gsm8k", 1, {**alias, "model": "r1-0120"}, tmp_path / "experts", cache, progress=False)
    assert pinned["questions_with_trajectory"] == 6 and pinned["served_models"] == ["r1-0120"]
    assert sum(script.requests.values()) == 5 + 2  # the four cached answers kept, the two others asked
    from meml.data.teachers import Cache

    newer = Cache(cache / "gsm8k/e1.jsonl", teacher_key({**alias, "model": "r1-0528"}))
    assert [r["served_model"] for r in newer.rows if newer.mine(r)] == ["r1-0528"]  # a pin of the new one: one answer
