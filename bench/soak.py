"""A bounded soak (issue 40 §8): one daemon under mixed, hostile load for N minutes, then five counts
that must all be zero.

    python bench/soak.py [--minutes 10] [--seed 0] [--clients 6] [--model DIR] [--cap-mb 160]
                         [--conversations 32] [--workdir DIR] [--json out.json]

The daemon (`cairn serve` in a child process): `--slots 4`, the disk tier (`--checkpoint-dir`) and the
shared tier (`--shared-checkpoint-dir`) on, speculation at its default (on), in a memory cgroup of
`--cap-mb` (tests/memory_cap.py) when the host has one. The default model is the generated
`tiny-wide-state` preset (~3.3 KiB of state a token): under the 160 MiB cap the plan leaves ~22 MiB
for states and checkpoints, about four of these conversations at once, so the guard evicts and
sometimes refuses (507) — the cap is near the plan's limit. (`--model models/cairn-code` runs the
default model instead; its 200 bytes a token never reach the cap.)

The load, from `--seed`: `--clients` conversation clients run multi-turn conversations drawn from a
pool of `--conversations` (each over the OpenAI or the Anthropic API, temperature 0, non-streamed or
streamed; some turns padded by an unknown field to just under the body limit, read from /v1/status
`memory.plan.body_bytes` at start: 256 KiB at the 160 MiB cap); before a turn a client may
disconnect mid-prefill or mid-decode and then send the same request again (a resume). Beside them a
poller hammers `GET /v1/status`, one client sends bad bodies (invalid JSON, wrong types, bad UTF-8, an
unknown model, a wrong method) and one bodies over the limit (a 4 MB prompt, 1.2 M token ids, one
byte over the plan's limit, a Content-Length over the 64 MiB limit), each of which must get a 413
`body_too_large` naming the limit (or a reset while it is still sent: the daemon answered unread).
Bad and large bodies go through every kind first, so the warm-up does all the work the load does. A
refused turn (429, 507) is retried a few times, then the conversation is dropped.

The checks (exit status 1 if any is not zero; one JSON summary on stdout):
  crashes         the daemon died, or its pid / uptime in /v1/status shows a restart
  wedges          a request that neither completed nor was refused within --request-timeout, or a
                  daemon that did not go idle after the load
  answers_changed a completed answer unlike the reference run's for the same prompt (a quiet daemon:
                  --slots 1, no checkpoints, speculation off, one request at a time), or unlike what
                  the same prompt gave elsewhere in the run
  oom_kills       the cgroup's oom_kill counter ("no cgroup" when the host has none)
  leaked_bytes    daemon RSS after the load and --idle seconds above the baseline + 5 %; the baseline
                  is taken the same way after a warm-up of the same load (--warmup seconds), which
                  fills the checkpoint budget, the reply table and the shared tier as the load does.
                  Both readings less the live states and memory checkpoints held then (status
                  `memory.in_use.pool_in_use_bytes`, shared page groups once): which conversations those are is chance (_net); raw RSS is
                  reported too. `--rounds N` reads it after each of N parts of the load: a
                  leak grows round after round, a plateau does not
Also counted (and failing): `unexpected`, an answer no client should get (a 5xx other than 507, a
bad body not refused with a 4xx error naming what was wrong, a status poll that failed).
Results: docs/benchmarks/soak.md (the summary in docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import trio

from cairn.daemon.cli.child import wait_until_serving

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from memory_cap import memory_cap, memory_cap_unavailable_reason  # noqa: E402

CAIRN = str(Path(sys.executable).parent / "cairn")
MAX_BODY = 64 << 20          # the protocol's limit (daemon/api/asgi.py); the plan's body_bytes may be lower


# --- the workload (pure: a function of the seed) ----------------------------------------------------

@dataclass(frozen=True)
class Conversation:
    cid: int
    api: str                    # "openai" | "anthropic"
    system: str
    users: tuple[str, ...]      # one user message a turn
    max_tokens: int


def corpus() -> str:
    """Text to cut prompts from: the repository's own Python sources (what cairn-code was trained
    on; any text does for a random-weight model)."""
    files = sorted((REPO / "daemon").rglob("*.py")) + sorted((REPO / "actors").rglob("*.py"))
    return "\n".join(p.read_text() for p in files)


def conversations(seed: int, n: int, text: str) -> list[Conversation]:
    """n conversations; every four share one of a few system prompts (system and common-prefix
    checkpoints, the shared tier's pages), turns extend the conversation (its live state)."""
    rng = random.Random(seed)

    def cut(lo: int, hi: int) -> str:
        size = rng.randint(lo, hi)
        start = rng.randrange(0, len(text) - size)
        return text[start:start + size]

    systems = [cut(600, 1400) for _ in range(max(1, n // 4))]
    return [Conversation(cid=i, api=rng.choice(("openai", "anthropic")), system=systems[i % len(systems)],
                         users=tuple(cut(60, 400) for _ in range(rng.randint(2, 4))),
                         max_tokens=rng.randint(16, 48))
            for i in range(n)]


def body(model: str, conv: Conversation, turn: int, answers: list[str], *, stream: bool = False,
         padding: int = 0) -> dict:
    """The request for `turn` of `conv`, its history holding the earlier turns' answers."""
    msgs = []
    for t in range(turn + 1):
        msgs.append({"role": "user", "content": conv.users[t]})
        if t < turn:
            msgs.append({"role": "assistant", "content": answers[t]})
    if conv.api == "openai":
        b = {"model": model, "messages": [{"role": "system", "content": conv.system}] + msgs}
    else:
        b = {"model": model, "system": conv.system, "messages": msgs}
    b.update(max_tokens=conv.max_tokens, temperature=0, stream=stream)
    if padding:
        b["x_soak_padding"] = "p" * padding     # an unknown field: accepted, logged once, ignored
    return b


def path_of(conv: Conversation) -> str:
    return "/v1/chat/completions" if conv.api == "openai" else "/v1/messages"


# --- HTTP over the Unix socket ------------------------------------------------------------------------

@dataclass
class Reply:
    status: int
    body: bytes

    def json(self):
        return json.loads(self.body)


def _head(method: str, path: str, n: int) -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {n}\r\nConnection: close\r\n\r\n").encode()


def _dechunk(rest: bytes) -> bytes:
    out = b""
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        out += rest[:size]
        rest = rest[size + 2:]
    return out


def _parse(data: bytes) -> Reply:
    if not data:
        raise ConnectionError("the daemon closed the connection without an answer")
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    if any(ln.lower().replace(" ", "") == "transfer-encoding:chunked" for ln in lines[1:]):
        rest = _dechunk(rest)
    return Reply(status, rest)


async def http(sock: str, method: str, path: str, payload: bytes = b"", *, head: bytes | None = None) -> Reply:
    stream = await trio.open_unix_socket(sock)
    async with stream:
        try:
            await stream.send_all((head or _head(method, path, len(payload))) + payload)
        except trio.BrokenResourceError:
            pass                       # the daemon answered (413) and closed before taking it all
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    return _parse(data)


def sse_events(raw: bytes) -> list[dict]:
    out = []
    for block in raw.decode().split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("data: ") and line[6:] != "[DONE]":
                out.append(json.loads(line[6:]))
    return out


class StreamError(ValueError):
    """A stream that ended with an error event (the message is the daemon's)."""


def refused_for_memory(message: str) -> bool:
    """507's message (`memory: …`), also as Anthropic's 400 `prompt is too long: memory: …`."""
    return message.startswith("memory:") or message.startswith("prompt is too long: memory:")


def answer_of(api: str, reply: Reply, streamed: bool) -> tuple[str, str]:
    """(text, finish reason) of a 200 answer, streamed or not."""
    if api == "openai":
        if not streamed:
            choice = reply.json()["choices"][0]
            return choice["message"].get("content") or "", choice["finish_reason"]
        text, finish = "", None
        for e in sse_events(reply.body):
            if "error" in e:
                raise StreamError(e["error"].get("message", str(e["error"])))
            for c in e.get("choices", ()):
                text += (c.get("delta") or {}).get("content") or ""
                finish = c.get("finish_reason") or finish
        return text, finish
    if not streamed:
        j = reply.json()
        return "".join(b.get("text", "") for b in j["content"] if b["type"] == "text"), j["stop_reason"]
    text, finish = "", None
    for e in sse_events(reply.body):
        if e.get("type") == "error":
            raise StreamError(e["error"].get("message", str(e["error"])))
        if e.get("type") == "content_block_delta" and e["delta"].get("type") == "text_delta":
            text += e["delta"]["text"]
        if e.get("type") == "message_delta":
            finish = e["delta"].get("stop_reason")
    return text, finish


# --- the daemon ----------------------------------------------------------------------------------------

class Daemon:
    """`cairn serve` in a child process, in a memory cgroup when one is given."""

    def __init__(self, model: Path, workdir: Path, name: str, args: list[str], cap=None) -> None:
        self.sock = str(workdir / f"{name}.sock")
        self.log = workdir / f"{name}.log"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.sock)           # a stale socket of an earlier run would pass for this one's
        argv = [CAIRN, "serve", "--model", str(model), "--socket", self.sock, "--threads", "2",
                "--packed-cache-dir", str(workdir / "packed"), *args]
        with open(self.log, "w") as out:
            # PYTHONFAULTHANDLER: a daemon that ignores SIGTERM gets SIGABRT, and its threads' stacks land in the log
            env = {**os.environ, "CAIRN_LOG_LEVEL": "info", "PYTHONFAULTHANDLER": "1"}
            self.proc = (cap.popen if cap else subprocess.Popen)(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        wait_until_serving(self.sock, self.proc, timeout=120, log=self.log)

    def rss(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def stop(self) -> int | None:
        """SIGTERM, then the exit status; None if it had to be aborted (its stacks are then in the log)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGABRT)
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
                return None
        return self.proc.returncode

    def events(self) -> list[dict]:
        out = []
        for line in self.log.read_text().splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out


# --- the reference run ------------------------------------------------------------------------------

async def reference(d: Daemon, model: str, convs: list[Conversation], timeout: float) -> dict[int, list[str]]:
    """Each conversation's answers from a quiet daemon, one request at a time. A conversation stops at
    its first empty answer (an assistant turn with no text is not a valid history on every API)."""
    out: dict[int, list[str]] = {}
    for conv in convs:
        answers: list[str] = []
        for turn in range(len(conv.users)):
            with trio.fail_after(timeout):
                r = await http(d.sock, "POST", path_of(conv), json.dumps(body(model, conv, turn, answers)).encode())
            if r.status != 200:
                raise RuntimeError(f"reference run: conversation {conv.cid} turn {turn}: {r.status} {r.body[:300]!r}")
            text, _ = answer_of(conv.api, r, False)
            if not text.strip():
                break
            answers.append(text)
        out[conv.cid] = answers
    return out


# --- the load --------------------------------------------------------------------------------------------

BAD_BODIES = [   # (path, payload, method): each must get a 4xx with an error body naming what was wrong
    ("/v1/chat/completions", b'{"model": "M", "messages": [', "POST"),
    ("/v1/chat/completions", b"[1, 2, 3]", "POST"),
    ("/v1/chat/completions", b'{"model": "M", "messages": "hello", "max_tokens": 4}', "POST"),
    ("/v1/chat/completions", b'{"model": "M", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"}',
     "POST"),
    ("/v1/chat/completions", b'{"model": "M", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}',
     "POST"),
    ("/v1/chat/completions", b'{"model": "M", "messages": [{"role": "user", "content": "\xff\xfe"}]}', "POST"),
    ("/v1/chat/completions", b'{"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}', "POST"),
    ("/v1/messages", b'{"model": "M", "max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]}', "POST"),
    ("/v1/messages", b'{"model": "M", "max_tokens": 8, "messages": [{"role": "user", "content": '
                     b'[{"type": "image", "source": {}}]}]}', "POST"),
    ("/v1/completions", b'{"model": "M", "prompt": [1, "a", 3], "max_tokens": 2}', "POST"),
    ("/v1/chat/completions", b"", "GET"),
]


@dataclass
class Tally:
    counts: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)     # the first few of each kind, for the summary
    seen: dict = field(default_factory=dict)              # (cid, turn) -> answer text, first seen

    def fail(self, kind: str, what: str) -> None:
        self.counts[kind] += 1
        if sum(f.startswith(kind) for f in self.failures) < 5:
            self.failures.append(f"{kind}: {what}")


@dataclass
class Load:
    d: Daemon
    model: str
    convs: list[Conversation]
    ref: dict[int, list[str]]
    tally: Tally
    timeout: float
    large: bool = True          # send padded turns and the large-body client
    body_limit: int = 64 << 20  # the largest body the daemon accepts (status memory.plan.body_bytes)
    until: float = 0.0
    pid: int = 0

    def stopping(self) -> bool:
        return trio.current_time() >= self.until

    async def bounded(self, what: str, fn, *args, reset_ok: bool = False):
        """fn(*args) within the wedge bound; None (and a wedge counted) past it. reset_ok: a connection
        reset while the body was still being sent is "reset" (the daemon refused it unread; the
        answer it wrote may be lost with the reset), not a failure."""
        with trio.move_on_after(self.timeout):
            try:
                return await fn(*args)
            except trio.BrokenResourceError as e:
                if reset_ok and isinstance(e.__cause__, ConnectionResetError):
                    return "reset"
                self.tally.fail("unexpected", f"{what}: {type(e).__name__}: {e}")
                return None
            except (OSError, trio.BrokenResourceError) as e:
                self.tally.fail("unexpected", f"{what}: {type(e).__name__}: {e}")
                return None
        self.tally.fail("wedges", f"{what}: no answer in {self.timeout:.0f} s")
        return None


async def disconnect(load: Load, conv: Conversation, payload: bytes, when: str, rng: random.Random) -> None:
    """Send a streamed turn and close the connection mid-prefill (after a short wait, before any
    token) or mid-decode (after the first tokens); counted by what had arrived when it closed."""
    stream = await trio.open_unix_socket(load.d.sock)
    got = b""
    async with stream:
        await stream.send_all(_head("POST", path_of(conv), len(payload)) + payload)
        marker = b'"content":' if conv.api == "openai" else b"text_delta"
        with trio.move_on_after(rng.uniform(0.005, 0.15) if when == "prefill" else load.timeout):
            while not (when == "decode" and got.count(marker) >= rng.randint(1, 3)):
                chunk = await stream.receive_some(65536)
                if not chunk:
                    break
                got += chunk
    load.tally.counts["disconnects_" + ("decode" if marker in got else "prefill")] += 1


async def complete(load: Load, conv: Conversation, turn: int, answers: list[str], rng: random.Random) -> str | None:
    """One turn to its end: the answer (checked), or None when refused past the retries or failed."""
    streamed = rng.random() < 0.5
    padding = 0
    payload = json.dumps(body(load.model, conv, turn, answers, stream=streamed)).encode()
    if load.large and rng.random() < 0.05:
        # padded to just under the plan's body limit (a turn over it is a 413, the large-body client's
        # probe): the daemon must take the largest body it accepts and still answer the same
        room = load.body_limit - len(payload) - 64
        if room > 0:
            padding = rng.randint(room // 2, room)
            payload = json.dumps(body(load.model, conv, turn, answers, stream=streamed, padding=padding)).encode()
    t = load.tally
    if rng.random() < 0.3:
        await load.bounded(f"disconnect c{conv.cid} t{turn}", disconnect, load, conv, payload,
                           rng.choice(("prefill", "decode")), rng)
        t.counts["retries"] += 1          # the same request again: resumes what the cancelled one left
    for attempt in range(4):
        r = await load.bounded(f"c{conv.cid} t{turn}", http, load.d.sock, "POST", path_of(conv), payload)
        if r is None:
            return None
        if r.status == 200:
            try:
                text, _ = answer_of(conv.api, r, streamed)
                break
            except StreamError as e:
                if not refused_for_memory(str(e)):
                    t.fail("unexpected", f"c{conv.cid} t{turn}: stream ended with an error: {e}")
                    return None
                t.counts["refused_507_in_stream"] += 1
                await trio.sleep(0.5 + attempt)
                continue
        if r.status in (429, 507) or (conv.api == "anthropic" and r.status == 400 and b"prompt is too long" in r.body):
            t.counts[f"refused_{r.status}"] += 1
            await trio.sleep(0.5 + attempt)
            continue
        t.fail("unexpected", f"c{conv.cid} t{turn}: HTTP {r.status} {r.body[:200]!r}")
        return None
    else:
        t.counts["dropped_conversations"] += 1
        return None
    t.counts["answers"] += 1
    t.counts["padded_bodies"] += bool(padding)
    t.counts["streamed"] += streamed
    want = load.ref[conv.cid][turn]
    first = t.seen.setdefault((conv.cid, turn), text)
    if text != want or text != first:
        t.fail("answers_changed", f"c{conv.cid} t{turn} ({conv.api}, {'streamed' if streamed else 'whole'}): "
                                  f"{text[:60]!r} against the reference {want[:60]!r}")
        return None
    return text


async def conversation_client(load: Load, seed: int) -> None:
    rng = random.Random(seed)
    while not load.stopping():
        conv = rng.choice(load.convs)
        answers: list[str] = []
        for turn in range(len(load.ref[conv.cid])):
            if load.stopping():
                break
            text = await complete(load, conv, turn, answers, rng)
            if text is None:
                break
            answers.append(text)
        load.tally.counts["conversations"] += 1


async def poller(load: Load) -> None:
    last_uptime = 0.0
    while not load.stopping():
        r = await load.bounded("GET /v1/status", http, load.d.sock, "GET", "/v1/status")
        if r is None:
            continue
        try:
            st = r.json()
            assert r.status == 200, r.status
            if st["pid"] != load.pid or st["uptime_s"] < last_uptime:
                load.tally.fail("crashes", f"restart: pid {st['pid']} uptime {st['uptime_s']}")
            last_uptime = st["uptime_s"]
        except (ValueError, KeyError, AssertionError) as e:
            load.tally.fail("unexpected", f"status poll: {e!r} {r.body[:200]!r}")
        load.tally.counts["status_polls"] += 1
        await trio.sleep(0.005)


def _clear_error(path: str, r: Reply) -> bool:
    try:
        j = r.json()
    except ValueError:
        return False
    err = j.get("error") or {}
    return 400 <= r.status < 500 and r.status != 429 and bool(err.get("message"))


async def bad_bodies(load: Load, rng: random.Random) -> None:
    sent = 0
    while not load.stopping():
        # every kind once first, so a short warm-up has done all the work the load does
        path, payload, method = BAD_BODIES[sent] if sent < len(BAD_BODIES) else rng.choice(BAD_BODIES)
        sent += 1
        payload = payload.replace(b'"M"', json.dumps(load.model).encode())
        r = await load.bounded(f"bad body {payload[:40]!r}", http, load.d.sock, method, path, payload)
        if r is not None:
            if _clear_error(path, r):
                load.tally.counts["bad_bodies_refused"] += 1
            else:
                load.tally.fail("unexpected", f"bad body {payload[:60]!r} on {path}: HTTP {r.status} {r.body[:200]!r}")
        await trio.sleep(rng.uniform(0.05, 0.4))


def _names_limit(r: Reply, limit: int) -> bool:
    """A 413 `body_too_large` whose message says how many bytes are accepted (the plan's body limit,
    or the protocol's 64 MiB when smaller)."""
    try:
        err = r.json().get("error") or {}
    except ValueError:
        return False
    return r.status == 413 and err.get("code") == "body_too_large" and str(limit) in (err.get("message") or "")


async def large_bodies(load: Load, rng: random.Random) -> None:
    """Bodies over the daemon's limit: each must be refused with a 413 naming the limit (or, when the
    daemon answered before taking the whole body, a reset while it was still being sent)."""
    m = load.model
    kinds, sent = ("text", "ids", "just_over", "over_limit"), 0
    while not load.stopping():
        kind = kinds[sent] if sent < len(kinds) else rng.choice(kinds)   # each once first (as bad_bodies)
        sent += 1
        if kind == "text":      # a several-MB prompt
            payload = json.dumps({"model": m, "max_tokens": 4, "messages": [
                {"role": "user", "content": "x = 1\n" * rng.randint(500_000, 700_000)}]}).encode()
            r = await load.bounded("large text body", http, load.d.sock, "POST", "/v1/chat/completions", payload,
                                   reset_ok=True)
        elif kind == "ids":
            payload = json.dumps({"model": m, "max_tokens": 4, "prompt": [5] * 1_200_000}).encode()
            r = await load.bounded("large id body", http, load.d.sock, "POST", "/v1/completions", payload,
                                   reset_ok=True)
        elif kind == "just_over":   # one byte over the plan's limit
            text = "y" * (load.body_limit + 1 - len(json.dumps({"model": m, "max_tokens": 4, "messages": [
                {"role": "user", "content": ""}]})))
            payload = json.dumps({"model": m, "max_tokens": 4, "messages": [{"role": "user", "content": text}]}).encode()
            r = await load.bounded("just-over body", http, load.d.sock, "POST", "/v1/chat/completions", payload,
                                   reset_ok=True)
        else:                   # Content-Length over the 64 MiB limit: refused before it is read
            head = _head("POST", "/v1/chat/completions", 80 << 20)   # the head alone: the answer comes first
            r = await load.bounded("over-limit body", partial(http, head=head), load.d.sock, "POST",
                                   "/v1/chat/completions", b"")
        if r == "reset":
            load.tally.counts["large_bodies_reset"] += 1
        elif r is not None:
            if _names_limit(r, load.body_limit):
                load.tally.counts["large_bodies_refused"] += 1
            else:
                load.tally.fail("unexpected", f"large body ({kind}): HTTP {r.status} {r.body[:200]!r}")
        await trio.sleep(rng.uniform(1.0, 3.0))


async def watcher(load: Load) -> None:
    while not load.stopping():
        if load.d.proc.poll() is not None:
            load.tally.fail("crashes", f"daemon exited with {load.d.proc.returncode}")
            load.until = trio.current_time()
            return
        await trio.sleep(0.5)


async def run_load(load: Load, seconds: float, clients: int, seed: int) -> None:
    load.until = trio.current_time() + seconds
    async with trio.open_nursery() as n:
        for i in range(clients):
            n.start_soon(conversation_client, load, seed * 1000 + i)
        n.start_soon(poller, load)
        n.start_soon(bad_bodies, load, random.Random(seed * 1000 + 900))
        if load.large:
            n.start_soon(large_bodies, load, random.Random(seed * 1000 + 901))
        n.start_soon(watcher, load)


async def settle(load: Load, idle: float) -> dict | None:
    """Wait for the engine to go idle (a wedge if it does not), then `idle` seconds; the status then."""
    if load.d.proc.poll() is not None:
        return None                    # counted as a crash by the caller
    st: dict = {"running": None, "queue": None}
    with trio.move_on_after(load.timeout):
        while True:
            st = (await http(load.d.sock, "GET", "/v1/status")).json()
            busy = st["running"] is not None or st["queue"]["depth"] or any(
                s.get("phase") != "idle" for s in st.get("slots", ()))
            if not busy:
                break
            await trio.sleep(0.2)
        await trio.sleep(idle)
        return (await http(load.d.sock, "GET", "/v1/status")).json()
    load.tally.fail("wedges", f"the engine did not go idle within {load.timeout:.0f} s after the load: running "
                              f"{st['running']}, queue {st['queue']}, slots {st.get('slots')}")
    return None


def figures(st: dict | None, rss: int) -> dict:
    if st is None:
        return {"rss_bytes": rss}
    mem = st["memory"]["in_use"]
    return {"rss_bytes": rss, "states_bytes": mem.get("states_bytes"), "checkpoint_bytes": mem.get("checkpoint_bytes"),
            "pool_in_use_bytes": mem.get("pool_in_use_bytes"),
            "checkpoints_memory": st["checkpoints"]["memory"]["count"],
            "checkpoints_disk": st["checkpoints"]["disk"]["count"],
            "replies_bytes": (st.get("replies") or {}).get("bytes"),
            "diagnostics_bytes": (st.get("cache_diagnostics") or {}).get("bytes")}


def _net(fig: dict) -> int | None:
    """RSS less the live states and memory checkpoints the daemon holds at that moment: which
    conversations the four slots and the checkpoint budget hold after the load is chance (up to ~30 MB
    of the ~135 MB here), so the leak check compares what is left — the daemon itself, its bounded
    tables, the allocator — against the baseline, ± 5 %. The guard's pool figure counts a page group
    a checkpoint shares with a live state once, as RSS does (states_bytes + checkpoint_bytes counts
    it twice, and a baseline holding shared checkpoints then reads several MB low)."""
    if fig.get("states_bytes") is None or not fig.get("rss_bytes"):
        return None
    held = fig.get("pool_in_use_bytes")
    return fig["rss_bytes"] - (held if held is not None else fig["states_bytes"] + fig["checkpoint_bytes"])


# --- main ------------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="length of the load (after the warm-up)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--clients", type=int, default=6, help="conversation clients at once")
    ap.add_argument("--conversations", type=int, default=32, help="the pool the clients draw from")
    ap.add_argument("--model", type=Path, help="model directory (default: tiny-wide-state, generated)")
    ap.add_argument("--cap-mb", type=int, default=160, help="memory cgroup limit (MiB); 0: none")
    ap.add_argument("--warmup", type=float, help="seconds of the same load before the RSS baseline "
                    "(default: 10 %% of the load, 15..60 s)")
    ap.add_argument("--rounds", type=int, default=1, help="split the load into this many rounds, RSS read after "
                    "each (a leak grows round after round; a plateau does not)")
    ap.add_argument("--idle", type=float, default=5.0, help="seconds idle before each RSS reading")
    ap.add_argument("--request-timeout", type=float, default=120.0, help="the wedge bound for one request")
    ap.add_argument("--speculate", default="on", help="the soak daemon's --speculate (the reference runs off)")
    ap.add_argument("--no-large-bodies", action="store_true", help="send no padded turn and no body over "
                    "the limit (to tell their memory from the rest's)")
    ap.add_argument("--workdir", type=Path, help="daemon logs, checkpoints (default: a temporary directory)")
    ap.add_argument("--json", type=Path, help="also write the summary here")
    a = ap.parse_args(argv)
    seconds = a.minutes * 60
    warmup = a.warmup if a.warmup is not None else min(60.0, max(15.0, seconds / 10))

    with contextlib.ExitStack() as stack:
        work = a.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cairn-soak-")))
        work.mkdir(parents=True, exist_ok=True)
        model_dir = a.model
        if model_dir is None:
            from cairn.daemon.modelgen.make_model import make_model
            model_dir = work / "wide"
            if not (model_dir / "generation_config.json").exists():
                make_model("tiny-wide-state", 0, model_dir)
        model = model_dir.name
        convs = conversations(a.seed, a.conversations, corpus())

        t0 = time.monotonic()
        ref_d = Daemon(model_dir, work, "reference", ["--slots", "1", "--no-checkpoints", "--speculate", "off",
                                                      "--checkpoint-dir", str(work / "ref-state")])
        try:
            ref = trio.run(reference, ref_d, model, convs, a.request_timeout)
        finally:
            ref_d.stop()
        ref_s = time.monotonic() - t0

        cap, no_cap = None, None
        if a.cap_mb and (no_cap := memory_cap_unavailable_reason()) is None:
            cap = stack.enter_context(memory_cap(a.cap_mb << 20, "soak"))
        d = Daemon(model_dir, work, "soak", ["--slots", "4", "--checkpoint-dir", str(work / "state"),
                                             "--shared-checkpoint-dir", str(work / "shared"), "--segment", "256",
                                             "--speculate", a.speculate], cap)
        stack.callback(d.stop)
        tally = Tally()
        load = Load(d, model, convs, ref, tally, a.request_timeout, large=not a.no_large_bodies, pid=d.proc.pid)

        async def soak() -> tuple[dict, dict]:
            st0 = (await http(d.sock, "GET", "/v1/status")).json()
            plan_body = (st0["memory"].get("plan") or {}).get("body_bytes")
            load.body_limit = min(MAX_BODY, plan_body or MAX_BODY)   # what the daemon accepts (daemon/api/app.py)
            await run_load(load, warmup, a.clients, a.seed + 1)
            base = await settle(load, a.idle)
            base_fig = figures(base, d.rss() if d.proc.poll() is None else 0)
            warm = Counter(tally.counts)
            tally.counts.clear()
            rounds = []
            for i in range(max(1, a.rounds)):
                await run_load(load, seconds / max(1, a.rounds), a.clients, a.seed + 100 * i)
                end = await settle(load, a.idle)
                rounds.append(figures(end, d.rss() if d.proc.poll() is None else 0))
                if end is None:
                    break
            return ({"plan": st0["memory"]["plan"], "warmup": dict(warm)},
                    {"baseline": base_fig, "end": rounds[-1], "rounds": rounds})

        t1 = time.monotonic()
        info, mem = trio.run(soak)
        load_s = time.monotonic() - t1
        alive = d.proc.poll() is None
        exit_status = d.stop()
        if not alive:
            tally.fail("crashes", f"daemon died (exit {d.proc.returncode})")
        elif exit_status != 0:
            tally.fail("crashes", f"daemon exited {exit_status} on SIGTERM" if exit_status is not None else
                       f"daemon did not exit on SIGTERM within 30 s (aborted: its stacks are in {d.log})")
        oom = cap.oom_kills() if cap is not None else "no cgroup"
        peak = cap.peak_bytes() if cap is not None else None
        events = Counter(e.get("event") for e in d.events() if e.get("level") in ("error", "critical"))
        if events.get("handler_failed"):
            tally.fail("unexpected", f"{events['handler_failed']} handler_failed log lines")

    base_rss, end_rss = mem["baseline"]["rss_bytes"], mem["end"]["rss_bytes"]
    base_net, end_net = _net(mem["baseline"]), _net(mem["end"])
    leaked = max(0, end_net - int(base_net * 1.05)) if end_net and base_net else 0
    c = tally.counts
    summary = {
        "crashes": c["crashes"], "wedges": c["wedges"], "answers_changed": c["answers_changed"],
        "oom_kills": oom, "leaked_bytes": leaked, "unexpected": c["unexpected"],
        "served": {"answers": c["answers"], "conversations": c["conversations"], "streamed": c["streamed"],
                   "padded_bodies": c["padded_bodies"], "status_polls": c["status_polls"],
                   "bad_bodies_refused": c["bad_bodies_refused"], "large_bodies_refused": c["large_bodies_refused"],
                   "large_bodies_reset": c["large_bodies_reset"],
                   "refused_507": c["refused_507"], "refused_507_in_stream": c["refused_507_in_stream"],
                   "refused_429": c["refused_429"],
                   "refused_400_too_long": c["refused_400"], "dropped_conversations": c["dropped_conversations"]},
        "disconnects": {"prefill": c["disconnects_prefill"], "decode": c["disconnects_decode"]},
        "retries": c["retries"],
        "rss": {"baseline": base_rss, "end": end_rss,
                "change_pct": round(100 * (end_rss - base_rss) / base_rss, 2) if base_rss else None,
                "net_baseline": base_net, "net_end": end_net,
                "net_change_pct": round(100 * (end_net - base_net) / base_net, 2) if base_net and end_net else None,
                "rounds": [{"rss": f["rss_bytes"], "net": _net(f)} for f in mem["rounds"]],
                "baseline_parts": mem["baseline"], "end_parts": mem["end"]},
        "cgroup": {"limit_bytes": a.cap_mb << 20, "peak_bytes": peak} if cap is not None else {"none": no_cap},
        "plan": {k: info["plan"].get(k) for k in ("limit_bytes", "room_bytes", "limit_source", "parts", "per_token_bytes",
                                                  "body_bytes")},
        "error_log_lines": dict(events),
        "setup": {"model": str(model_dir), "minutes": a.minutes, "large_bodies": load.large, "speculate": a.speculate, "warmup_s": warmup, "seed": a.seed,
                  "clients": a.clients, "conversations": a.conversations,
                  "reference_answers": sum(len(v) for v in ref.values()), "reference_s": round(ref_s, 1),
                  "load_s": round(load_s, 1), "warmup_counts": info["warmup"]},
        "failures": tally.failures,
    }
    failed = [k for k in ("crashes", "wedges", "answers_changed", "leaked_bytes", "unexpected") if summary[k]]
    if isinstance(oom, int) and oom:
        failed.append("oom_kills")
    summary["ok"] = not failed
    text = json.dumps(summary, indent=1)
    print(text)
    if a.json:
        a.json.write_text(text)
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
