"""Stand-ins for the paper's teachers, so that the real world's teacher stage runs on a CPU
without an API key (config/real-smoke.yaml). Nothing here is used by the paper config.

    StandinServer  an OpenAI-compatible chat-completions server on 127.0.0.1 that answers like
                   DeepSeek-R1: its reasoning in `reasoning_content`, a short final answer in
                   `content`. The reasoning is the question's gold rationale; the first attempt
                   at every third question is answered wrongly, so rejection sampling has work.
                   It counts what it answered (`answered`), so a test can hold the teachers table
                   against it. The teach command starts it for a teacher with `standin: true`.
    write_byo_file a bring-your-own JSONL file of expert k's trajectories (a reflective rewrite
                   of the gold rationale, one in eight wrong), for the `jsonl` backend.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from meml.core.answers import canonical_answer_line
from meml.core.io import atomic_write_jsonl
from meml.core.records import Record, read_records
from meml.data.experts import user_message


def _wrong(record: Record) -> str:
    """An answer the checker rejects."""
    if record.dataset == "strategyqa":
        return "no" if record.answer == "yes" else "yes"
    if record.dataset == "mathqa":
        return "a" if record.answer != "a" else "b"
    return str(int(float(record.answer)) + 1) if record.answer.lstrip("-").replace(".", "").isdigit() else "0"


class StandinServer:
    """`with StandinServer(records) as url:` serves at url (…/v1) until the block ends."""

    def __init__(self, records: list[Record]) -> None:
        self.by_question = {user_message(r): r for r in records}
        self.position = {user_message(r): i for i, r in enumerate(records)}
        self.asked: Counter[str] = Counter()
        self.answered = {"accepted_expected": 0, "wrong": 0, "requests": 0}
        self.lock = threading.Lock()
        self.httpd: ThreadingHTTPServer | None = None

    def reply(self, question: str) -> dict[str, Any]:
        record = self.by_question.get(question)
        with self.lock:
            self.asked[question] += 1
            first = self.asked[question] == 1
            self.answered["requests"] += 1
            if record is None:
                return {"content": "I do not know this question.", "reasoning_content": ""}
            wrong = first and self.position[question] % 3 == 0
            self.answered["wrong" if wrong else "accepted_expected"] += 1
        answer = _wrong(record) if wrong else record.answer
        reasoning = f"Okay, let me think this through.\n{record.rationale.strip()}\nWait, let me double-check. Yes."
        return {"content": f"The answer follows.\n{canonical_answer_line(record.dataset, answer)}",
                "reasoning_content": reasoning}  # fmt: skip

    def __enter__(self) -> str:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                message = server.reply(body["messages"][-1]["content"])
                payload = json.dumps(
                    {"choices": [{"message": {"role": "assistant", **message}}], "usage": {"total_tokens": 64}}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __exit__(self, *exc: Any) -> None:
        assert self.httpd is not None
        self.httpd.shutdown()
        self.httpd.server_close()


def write_byo_file(data_dir: str | Path, dataset: str, expert: int, out: str | Path) -> int:
    """<out>/<dataset>/e<expert>.jsonl: a reflective rewrite of every gold rationale; every eighth
    answer is wrong (the jsonl backend drops what the checker rejects)."""
    rows = []
    for i, r in enumerate(read_records(Path(data_dir) / "train.jsonl", dataset)):
        answer = _wrong(r) if i % 8 == 7 else r.answer
        text = f"Let me reflect on what is asked.\n{r.rationale.strip()}\nOn reflection, this holds.\n"
        rows.append({"id": r.id, "expert": expert, "completion": text + canonical_answer_line(dataset, answer)})
    return atomic_write_jsonl(Path(out) / dataset / f"e{expert}.jsonl", rows)
