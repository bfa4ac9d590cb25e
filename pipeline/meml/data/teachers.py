"""Teacher trajectories for the real world's experts 1, 2, ...: ask a teacher model, keep what the
answer checker accepts (rejection sampling), cache every attempt, resume where a run stopped.

Backends (config `teachers.e<k>.backend`):
    openai  an OpenAI-compatible chat-completions API (DeepSeek-R1, Doubao-1.5-thinking, ...). The
            key is read from the environment variable named by `api_key_env`, never from the config,
            and is scrubbed from every message. R1-style APIs return the reasoning in a separate
            `reasoning_content` field; it is kept, inside <think></think>.
    vllm    a local model in vLLM's offline batch mode (GPU extra): a substitute teacher, which the
            provenance and the MLflow tags mark as a deviation from the paper.
    jsonl   bring your own: a JSONL file of {id, expert, completion} lines, validated on load.

The cache is append-only JSONL, one line per attempt: {key, id, expert, attempt, status, ...},
`key` a hash of the teacher's settings. An item is finished once accepted or out of attempts;
a run started again never asks for a finished item. Each answer also records the model the API
named in its reply (`served_model`: `deepseek-reasoner` is an alias its provider has repointed), and
`served_key`, the same hash with that model in place of the configured name: a cached answer counts
for the settings it was asked under and for settings that name the model that wrote it. Answers of
two models under one expert's settings stop the run, naming both (ServedModelChanged). Network
failures (429, 5xx, timeouts, malformed JSON) are retried with exponential backoff and jitter; an
item that still fails is recorded as `failed`, the run goes on, and the next run asks for it again.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meml.core.answers import canonical_answer_line, extract, is_correct
from meml.core.io import DataError, atomic_write_json, locked, read_jsonl
from meml.core.records import Record, read_records
from meml.data.experts import DEFAULT_PROMPTS, chat_messages, read_trajectories, trajectory_stats, write_trajectories

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


DEFAULTS: dict[str, Any] = {
    "api_key_env": None,
    "temperature": None,  # None: the API's own default
    "top_p": None,
    "max_tokens": 8192,
    "timeout": 600.0,
    "max_attempts": 4,
    "retries": 5,
    "backoff_base": 2.0,
    "backoff_max": 60.0,
    "concurrency": 8,
}
REQUIRED = {"openai": ("base_url", "model"), "vllm": ("model",), "jsonl": ("path",)}


def settings_for(cfg: dict[str, Any], expert: int) -> dict[str, Any]:
    """`teachers.e<k>` with the defaults filled in; errors name the key."""
    key = f"teachers.e{expert}"
    if f"e{expert}" not in cfg["teachers"]:
        raise DataError("the real world needs a teacher for this expert (openai, vllm or jsonl)", None, None, key)
    settings = {**DEFAULTS, **cfg["teachers"][f"e{expert}"]}
    for name in REQUIRED[settings["backend"]]:
        if not settings.get(name):
            raise DataError(f"backend '{settings['backend']}' needs '{name}'", None, None, f"{key}.{name}")
    return settings


class TransientError(Exception):
    """A request that may succeed when tried again (429, 5xx, timeout, malformed reply)."""


@dataclass
class Reply:
    content: str
    reasoning: str
    tokens: int
    model: str = ""  # the model the API named in its reply ("": the backend does not say)


class ServedModelChanged(DataError):
    """The model behind a teacher's configured name is another than the one that wrote its cached answers."""


SHAPING = ("backend", "base_url", "model", "path", "temperature", "top_p", "max_tokens")


def teacher_key(settings: dict[str, Any]) -> str:
    """Hash of the settings that shape a teacher's answers: not timeouts, retries, attempts,
    concurrency or the key's name, so changing those reuses every cached answer."""
    shaping = {k: settings.get(k) for k in SHAPING}
    return hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:12]


class OpenAITeacher:
    """POST {base_url}/chat/completions with the standard library (no client package needed)."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        env = settings.get("api_key_env")
        self.key = os.environ.get(env, "") if env else ""
        if env and not self.key:
            raise DataError(f"the API key's environment variable {env} is not set", None, None, "api_key_env")

    def scrub(self, text: str) -> str:
        return text.replace(self.key, "***") if self.key else text

    def ask(self, messages: list[dict[str, str]]) -> Reply:
        s = self.settings
        body = {"model": s["model"], "messages": messages, "max_tokens": s["max_tokens"]}
        for name in ("temperature", "top_p"):
            if s.get(name) is not None:
                body[name] = s[name]
        request = urllib.request.Request(
            s["base_url"].rstrip("/") + "/chat/completions",
            data=json.dumps(body).encode(),
            headers={
                "Content-Type": "application/json",
                **({"Authorization": f"Bearer {self.key}"} if self.key else {}),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=float(s["timeout"])) as response:
                raw = response.read()
        except urllib.error.HTTPError as err:
            detail = self.scrub(err.read()[:200].decode("utf-8", "replace"))
            if err.code in RETRY_STATUS:
                raise TransientError(f"HTTP {err.code}: {detail}") from None
            raise DataError(f"teacher API refused the request: HTTP {err.code}: {detail}") from None
        except TimeoutError as err:
            raise TransientError(f"timeout: {err}") from None
        except urllib.error.URLError as err:
            raise TransientError(self.scrub(f"connection failed: {err.reason}")) from None
        try:
            reply = json.loads(raw)
            message = reply["choices"][0]["message"]
            content = message.get("content") or ""
            reasoning = message.get("reasoning_content") or ""
            tokens = int((reply.get("usage") or {}).get("total_tokens") or 0)
            served = str(reply.get("model") or "")  # the model that answered, where the API names it
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as err:
            raise TransientError(f"malformed reply: {type(err).__name__}") from None
        return Reply(content, reasoning, tokens, served)


class VLLMTeacher:
    """A local model through vLLM's offline engine, in batch mode: `ask_many` sends every
    unfinished question of a round at once (vLLM schedules the batch itself)."""

    def __init__(self, settings: dict[str, Any]) -> None:
        from meml.core.gpus import claim

        claim(1)  # a GPU of its own (the rule counts one for a vLLM teacher), before anything touches CUDA
        try:
            from vllm import LLM, SamplingParams
        except ImportError:
            raise DataError("teacher backend 'vllm' needs the GPU extra: pip install '.[gpu]'") from None
        self.llm = LLM(model=settings["model"], dtype="bfloat16")
        self.params = SamplingParams(
            temperature=settings.get("temperature") or 0.0,
            top_p=settings.get("top_p") or 1.0,
            max_tokens=settings["max_tokens"],
        )
        self.lock = threading.Lock()

    def scrub(self, text: str) -> str:
        return text

    def ask(self, messages: list[dict[str, str]]) -> Reply:
        return self.ask_many([messages])[0]

    def ask_many(self, conversations: list[list[dict[str, str]]]) -> list[Reply]:
        with self.lock:
            results = self.llm.chat(conversations, self.params, use_tqdm=True)  # type: ignore[arg-type]
        replies = []
        for result in results:
            out = result.outputs[0]
            reasoning, _, answer = out.text.partition("</think>")  # R1-style models think inline
            if not answer:
                reasoning, answer = "", out.text
            replies.append(Reply(answer.strip(), reasoning.replace("<think>", "").strip(), len(out.token_ids)))
        return replies


def make_teacher(settings: dict[str, Any]) -> Any:
    if settings["backend"] == "openai":
        return OpenAITeacher(settings)
    if settings["backend"] == "vllm":
        return VLLMTeacher(settings)
    raise DataError(f"backend '{settings['backend']}' does not generate", None, None, "backend")


def trajectory(reply: Reply, record: Record) -> str | None:
    """The stored trajectory: reasoning in <think></think>, then the answer, ending with the data
    set's canonical answer line (added when the teacher wrote its answer another way). None when
    the checker does not accept the answer."""
    if not is_correct(reply.content, record.dataset, record.answer, "lenient", record.options):
        return None
    text = reply.content.strip()
    if extract(text, record.dataset, "strict", record.options) is None:
        text = f"{text}\n{canonical_answer_line(record.dataset, record.answer)}"
    return f"<think>\n{reply.reasoning.strip()}\n</think>\n{text}" if reply.reasoning.strip() else text


def with_backoff(
    call: Callable[[], Reply], retries: int, base: float, cap: float, sleep: Callable[[float], None] = time.sleep
) -> Reply:
    """Try `call` up to retries + 1 times; wait base * 2^i (capped, times a jitter in [0.5, 1.5))."""
    for i in range(retries + 1):
        try:
            return call()
        except TransientError:
            if i == retries:
                raise
            sleep(min(cap, base * 2**i) * (0.5 + random.random()))
    raise AssertionError("unreachable")


def served_key(settings: dict[str, Any], served: str) -> str:
    """teacher_key with the model the API named in place of the configured one: the same for an
    alias and for a pin of the model that answered it."""
    return teacher_key({**settings, "model": served}) if served else teacher_key(settings)


class Cache:
    """Append-only attempts of one data set and expert; thread-safe appends, flushed per line. A row
    is this teacher's when asked under its settings (`key`) or written by the model they name
    (`served_key`)."""

    def __init__(self, path: Path, key: str) -> None:
        self.path, self.key = path, key
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()
        self.rows = [row for _, row in read_jsonl(path)] if path.is_file() else []

    def mine(self, row: dict[str, Any]) -> bool:
        return bool(row["key"] == self.key or row.get("served_key") == self.key)

    def attempts(self, item: str) -> list[dict[str, Any]]:
        return [r for r in self.rows if self.mine(r) and r["id"] == item and r["status"] != "failed"]

    def served_models(self) -> list[str]:
        """The models the API named in this teacher's cached answers, oldest first."""
        with self.lock:
            named = [r["served_model"] for r in self.rows if self.mine(r) and r.get("served_model")]
        return list(dict.fromkeys(named))

    def finished(self, item: str, max_attempts: int) -> bool:
        done = self.attempts(item)
        return any(r["status"] == "accepted" for r in done) or len(done) >= max_attempts

    def append(self, row: dict[str, Any]) -> None:
        with self.lock, self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"key": self.key, **row}) + "\n")
            f.flush()
            self.rows.append({"key": self.key, **row})


def check_served(cache: Cache, expert: int, settings: dict[str, Any]) -> None:
    """One model behind one expert: the answers of two (a provider repointed the configured name)
    stop the run before more are mixed, naming both and the two ways on."""
    models = cache.served_models()
    if len(models) < 2:
        return
    old, new = models[0], models[-1]
    count = sum(1 for r in cache.rows if cache.mine(r) and r.get("served_model") == old)
    raise ServedModelChanged(
        f"teacher e{expert}: the API now answers model '{settings['model']}' with '{new}', where {count} cached "
        f"answers came from '{old}': the provider has pointed the name at another model, and one expert's "
        f"trajectories would mix two teachers. Set teachers.e{expert}.model: '{old}' to keep the cached answers "
        f"(if the API still serves it), or '{new}' to ask this expert's questions again under the new model (the "
        "cache keeps both)",
        cache.path,
        None,
        f"teachers.e{expert}.model",
    )


@locked("cache_path", folder=False)  # one writer of a teacher's cache at a time
def generate(
    records: Sequence[Record],
    expert: int,
    settings: dict[str, Any],
    cache_path: str | Path,
    *,
    prompts: Sequence[str] = DEFAULT_PROMPTS,
    teacher: Any = None,
    sleep: Callable[[float], None] = time.sleep,
    progress: bool = True,
) -> dict[str, Any]:
    """Ask the teacher for every unfinished record, up to `max_attempts` accepted-or-rejected tries
    each; returns counts. `teacher` can be injected (tests)."""
    from tqdm import tqdm

    teacher = teacher or make_teacher(settings)
    cache = Cache(Path(cache_path), teacher_key(settings))
    check_served(cache, expert, settings)  # a change found by an earlier run stops this one before it asks
    max_attempts = int(settings["max_attempts"])
    todo = [r for r in records if not cache.finished(r.id, max_attempts)]
    provenance = {k: settings.get(k) for k in SHAPING if k != "path"}
    counts = {"requested_items": len(todo), "accepted": 0, "rejected": 0, "failed": 0, "tokens": 0}
    lock = threading.Lock()
    stop = threading.Event()  # set when the served model changed: no request starts after it

    def work(record: Record) -> None:
        attempt = len(cache.attempts(record.id))
        while attempt < max_attempts and not stop.is_set():
            attempt += 1
            started = time.time()
            try:
                reply = with_backoff(
                    lambda: teacher.ask(chat_messages(record, expert, prompts)),
                    int(settings["retries"]),
                    float(settings["backoff_base"]),
                    float(settings["backoff_max"]),
                    sleep,
                )
            except TransientError as err:
                cache.append(
                    {
                        "id": record.id,
                        "expert": expert,
                        "attempt": attempt,
                        "status": "failed",
                        "error": teacher.scrub(str(err)),
                        "time": round(time.time() - started, 2),
                    }
                )
                with lock:
                    counts["failed"] += 1
                return
            if keep(record, attempt, reply, time.time() - started):
                return

    def keep(record: Record, attempt: int, reply: Reply, seconds: float) -> bool:
        """Check one reply, cache the attempt; True when accepted."""
        # a reply may echo the key (a proxy, a debugging endpoint): nothing unscrubbed is written
        reply = Reply(teacher.scrub(reply.content), teacher.scrub(reply.reasoning), reply.tokens, reply.model)
        text = trajectory(reply, record)
        status = "accepted" if text is not None else "rejected"
        cache.append({
            "id": record.id, "expert": expert, "attempt": attempt, "status": status,
            "completion": text, "content": reply.content, "reasoning": reply.reasoning,
            "tokens": reply.tokens, "time": round(seconds, 2), "teacher": provenance,
            "served_model": reply.model or None, "served_key": served_key(settings, reply.model),
        })  # fmt: skip
        with lock:
            counts[status] += 1
            counts["tokens"] += reply.tokens
        if reply.model and len(cache.served_models()) > 1:  # kept (it is paid for); no new request starts
            stop.set()
        return text is not None

    bar = tqdm(total=len(todo), desc=f"teacher e{expert}", unit="question", disable=not progress)

    def tick(n: int = 1) -> None:
        tried = counts["accepted"] + counts["rejected"]
        bar.set_postfix(accepted=f"{counts['accepted'] / max(tried, 1):.0%}", tokens=counts["tokens"])
        bar.update(n)

    if hasattr(teacher, "ask_many"):
        # offline batch mode (vLLM): every unfinished question in one call per round of attempts
        for _ in range(max_attempts):
            pending = [r for r in todo if not cache.finished(r.id, max_attempts)]
            if not pending:
                break
            started = time.time()
            replies = teacher.ask_many([chat_messages(r, expert, prompts) for r in pending])
            seconds = (time.time() - started) / len(pending)
            for record, reply in zip(pending, replies, strict=True):
                keep(record, len(cache.attempts(record.id)) + 1, reply, seconds)
            if stop.is_set():
                break
            tick(sum(cache.finished(r.id, max_attempts) for r in pending))
    else:
        with ThreadPoolExecutor(max_workers=int(settings["concurrency"])) as pool:
            for future in as_completed([pool.submit(work, r) for r in todo]):
                future.result()
                tick()
    bar.close()
    check_served(cache, expert, settings)  # the answers of another model stop the job, named
    return counts


def accepted(cache: Cache, records: Sequence[Record]) -> list[tuple[Record, str]]:
    """The accepted trajectory of each record that has one (current teacher settings only)."""
    out = []
    for record in records:
        rows = [r for r in cache.attempts(record.id) if r["status"] == "accepted"]
        if rows:
            out.append((record, rows[0]["completion"]))
    return out


def stats(
    cache: Cache, records: Sequence[Record], kept: list[tuple[Record, str]], expert: int, settings: dict[str, Any]
) -> dict[str, Any]:
    """Acceptance rate (accepted / attempted) and trajectory lengths, for the report."""
    rows = [r for r in cache.rows if cache.mine(r)]
    tried = [r for r in rows if r["status"] in ("accepted", "rejected")]
    n_accepted = sum(r["status"] == "accepted" for r in tried)
    failed_items = {r["id"] for r in rows if r["status"] == "failed"} - {rec.id for rec, _ in kept}
    return {
        "expert": expert,
        "teacher": {k: settings.get(k) for k in ("backend", "model", "base_url")},
        "served_models": cache.served_models(),  # the model(s) the API named in its replies: one, or none said
        "questions": len(records),
        "attempted": len(tried),
        "accepted": n_accepted,
        "acceptance_rate": round(n_accepted / len(tried), 4) if tried else None,
        "questions_with_trajectory": len(kept),
        "questions_failed": len(failed_items),
        "tokens": sum(int(r.get("tokens") or 0) for r in rows),
        "length": trajectory_stats([c for _, c in kept]),
    }


def build_expert(
    data_dir: str | Path,
    dataset: str,
    expert: int,
    settings: dict[str, Any],
    out_dir: str | Path,
    cache_dir: str | Path,
    prompts: Sequence[str] = DEFAULT_PROMPTS,
    teacher: Any = None,
    progress: bool = True,
) -> dict[str, Any]:
    """e<k>.jsonl for one data set: from the teacher (generate, then keep the accepted) or from a
    bring-your-own file; plus e<k>.stats.json. Returns the statistics."""
    records = read_records(Path(data_dir) / "train.jsonl", dataset)
    out = Path(out_dir) / f"e{expert}.jsonl"
    if settings["backend"] == "jsonl":
        path = Path(settings["path"]) / dataset / f"e{expert}.jsonl"
        by_id = {r.id: r for r in records}
        items = read_trajectories(path, by_id, as_sft_data=False)  # several tries per question, some wrong
        wrong = [(line, r.id) for line, (r, k, c) in enumerate(items, 1) if k != expert]
        if wrong:
            raise DataError(f"expert should be {expert} in this file", path, wrong[0][0], "expert")
        kept = [(r, c) for r, _, c in items if is_correct(c, dataset, r.answer, "strict", r.options)]
        summary = {
            "expert": expert,
            "teacher": {"backend": "jsonl", "path": str(path)},
            "questions": len(records),
            "attempted": len(items),
            "accepted": len(kept),
            "acceptance_rate": round(len(kept) / len(items), 4) if items else None,
            "questions_with_trajectory": len(kept),
            "length": trajectory_stats([c for _, c in kept]),
        }
    else:
        cache = Path(cache_dir) / dataset / f"e{expert}.jsonl"
        counts = generate(records, expert, settings, cache, prompts=prompts, teacher=teacher, progress=progress)
        attempts = Cache(cache, teacher_key(settings))
        # a question whose every try failed (API errors after the retries) has not been asked: no
        # output yet, so that the workflow's next run runs this job again, and asks only those
        unasked = [r.id for r in records if not attempts.finished(r.id, int(settings["max_attempts"]))]
        if unasked:
            raise DataError(
                f"{len(unasked)} of {len(records)} questions got no reply from teacher e{expert} (API errors after "
                f"teachers.e{expert}.retries retries; e.g. {unasked[0]}): run the workflow again to ask those only "
                "(every finished question is kept in the cache)",
                cache,
            )
        kept = accepted(attempts, records)
        summary = {**stats(attempts, records, kept, expert, settings), "this_run": counts}
    if not kept:
        raise DataError(f"no trajectory of expert {expert} was accepted on {dataset}", out)
    write_trajectories(out, expert, kept, f"teacher {summary['teacher']}")
    atomic_write_json(Path(out_dir) / f"e{expert}.stats.json", summary)
    return summary
