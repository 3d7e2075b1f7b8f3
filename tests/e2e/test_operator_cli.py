"""The operator's view of a running daemon: `cairn chat`, `cairn status`, `cairn checkpoints`, SSE
progress comments and /metrics — against `cairn serve` run as a subprocess (real kernel, tiny model)
on a temporary socket, the CLI run as a subprocess too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest

CAIRN = [sys.executable, "-m", "cairn.daemon.cli.main"]
SYSTEM = "You are a terse assistant."
# ~600 tokens with the tiny model's tokenizer (a few characters per token on this text)
LONG_TEXT = " ".join(f"line {i}: the quick brown fox jumps over the lazy dog" for i in range(20))


@pytest.fixture(scope="module")
def served(tiny_model_dir, tmp_path_factory):
    """`cairn serve` on a temp socket; small segments and no progress throttle so a ~600-token prompt
    gives several progress messages."""
    tmp = tmp_path_factory.mktemp("op")
    sock = tmp / "cairn.sock"
    log = open(tmp / "serve.log", "w")
    proc = subprocess.Popen(CAIRN + ["serve", "--slots", "1", "--model", str(tiny_model_dir), "--socket", str(sock),
                                     "--segment", "64", "--chunk", "32", "--progress-interval-ms", "0",
                                     "--checkpoint-min-tokens", "256", "--log-level", "warning"],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "CAIRN_SOCKET": ""})
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp / "serve.log").read_text()
            assert time.monotonic() < deadline, "daemon did not come up"
            if sock.exists():
                try:
                    with _http(sock) as c:
                        if c.get("/health").status_code == 200:
                            break
                except httpx.TransportError:
                    pass
            time.sleep(0.1)
        yield sock
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _http(sock) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://cairn", timeout=60)


def cli(sock, *args, stdin_text: str | None = None, env_socket: bool = True, timeout: float = 120):
    env = {**os.environ, "PYTHONIOENCODING": "utf-8", "CAIRN_SOCKET": str(sock) if env_socket else ""}
    return subprocess.run(CAIRN + list(args), input=stdin_text, capture_output=True, text=True,
                          encoding="utf-8", env=env, timeout=timeout,
                          stdin=None if stdin_text is not None else subprocess.DEVNULL)


def _greedy_chat(sock, user: str, max_tokens: int = 16, system: str | None = SYSTEM) -> dict:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    with _http(sock) as c:
        r = c.post("/v1/chat/completions", json={"model": "tiny", "messages": messages, "temperature": 0,
                                                 "max_tokens": max_tokens})
    assert r.status_code == 200, r.text
    return r.json()


def _expected_stdout(content: str) -> str:
    return content if content.endswith("\n") else content + "\n"


def test_chat_one_shot_and_piped_print_the_greedy_answer(served):
    want = _greedy_chat(served, "Say hello.")["choices"][0]["message"]["content"]
    assert want
    r = cli(served, "chat", "--system", SYSTEM, "--temperature", "0", "--max-tokens", "16", "Say", "hello.")
    assert r.returncode == 0, r.stderr
    assert r.stdout == _expected_stdout(want)
    # the prompt on stdin, the socket as a flag
    r = cli(served, "chat", "--socket", str(served), "--system", SYSTEM, "--temperature", "0", "--max-tokens", "16",
            stdin_text="Say hello.", env_socket=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout == _expected_stdout(want)
    assert "prefill [" not in r.stderr                         # no progress bar unless asked or on a terminal


def _progress_stream(sock, body: dict) -> tuple[list[dict], list[dict], int]:
    """(progress comments, data events, index of the first data event among all lines)."""
    progress, data, first_data = [], [], None
    with _http(sock) as c, c.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith(": progress "):
                progress.append(json.loads(line[len(": progress "):]))
            elif line.startswith("data: ") and line != "data: [DONE]":
                if first_data is None:
                    first_data = len(progress)
                data.append(json.loads(line[6:]))
    return progress, data, first_data


def test_progress_comments_during_a_long_streamed_prefill(served):
    body = {"model": "tiny", "messages": [{"role": "user", "content": LONG_TEXT}], "stream": True,
            "max_tokens": 4, "temperature": 0, "stream_options": {"include_usage": True}}
    progress, data, first_data = _progress_stream(served, body)
    usage = data[-1]["usage"]
    assert 500 <= usage["prompt_tokens"] <= 1000                       # a ~600-token prompt …
    assert len(progress) >= 4, progress                                # … gives several (segment 64)
    assert first_data == len(progress)                                 # all before the first data event
    assert all(p["total"] == usage["prompt_tokens"] for p in progress)
    dones = [p["done"] for p in progress]
    assert dones == sorted(dones) and dones[0] == usage["prompt_tokens_details"]["cached_tokens"]
    assert dones[-1] == usage["prompt_tokens"]
    assert progress[0]["eta_s"] is None and all(isinstance(p["eta_s"], (int, float)) for p in progress[1:])
    assert all(p["done"] % 32 == 0 or p["done"] == p["total"] for p in progress)   # chunk boundaries

    # the official client ignores the comments
    import openai
    client = openai.OpenAI(base_url="http://cairn/v1", api_key="unused",
                           http_client=httpx.Client(transport=httpx.HTTPTransport(uds=str(served))))
    text = "".join(ch.choices[0].delta.content or "" for ch in client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": LONG_TEXT + " again"}], stream=True, max_tokens=4,
        temperature=0) if ch.choices)
    assert isinstance(text, str)

    # `cairn chat --progress` draws them on stderr; stdout carries only the answer
    r = cli(served, "chat", "--progress", "--temperature", "0", "--max-tokens", "4", stdin_text=LONG_TEXT + " more")
    assert r.returncode == 0, r.stderr
    bars = [ln for ln in r.stderr.splitlines() if ln.startswith("prefill [")]
    assert len(bars) >= 2 and "tokens" in bars[-1] and "eta" in bars[-1]
    assert "prefill [" not in r.stdout


def test_status_shows_model_live_tokens_and_the_running_request(served):
    out = _greedy_chat(served, "Count to three.", max_tokens=6)
    u = out["usage"]
    live = u["prompt_tokens"] + u["completion_tokens"] - 1     # every generated token but the last is fed
    r = cli(served, "status")
    assert r.returncode == 0, r.stderr
    assert "model        tiny" in r.stdout
    assert f"live state   {live} tokens" in r.stdout
    assert "running      idle" in r.stdout
    s = json.loads(cli(served, "status", "--json").stdout)
    assert s["model"]["id"] == "tiny" and s["model"]["kernel_threads"] >= 1
    assert s["model"]["fingerprint"] and s["version"] and s["uptime_s"] > 0
    assert s["live_state_tokens"] == live and s["running"] is None
    assert s["queue"] == {"depth": 0, "capacity": 8}
    assert s["memory"]["rss_bytes"] > 10 << 20
    assert set(s["checkpoints"]) >= {"memory", "disk"}
    assert {"count", "bytes"} <= set(s["checkpoints"]["memory"])

    # while a long prefill runs, status shows it (id, phase, tokens done/total)
    big = " ".join(f"item {i} of a long list of things to remember" for i in range(1500))
    body = {"model": "tiny", "messages": [{"role": "user", "content": big}], "stream": True, "max_tokens": 2}
    with _http(served) as c, c.stream("POST", "/v1/chat/completions", json=body) as resp:
        lines = resp.iter_lines()
        first = next(ln for ln in lines if ln.startswith(": progress "))
        total = json.loads(first[len(": progress "):])["total"]
        running = c.get("/v1/status").json()["running"]
        assert running is not None and running["id"].startswith("chatcmpl-")
        assert running["phase"] in ("prefill", "decode")
        if running["phase"] == "prefill":
            assert running["tokens_total"] == total and 0 <= running["tokens_done"] <= total
        human = cli(served, "status").stdout
        assert "running      chatcmpl-" in human or "running      idle" in human
    # the client went away: the request is cancelled and the board is empty again
    deadline = time.monotonic() + 10
    while True:
        with _http(served) as c:
            if c.get("/v1/status").json()["running"] is None:
                break
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_checkpoints_ls_and_rm(served):
    # a prompt longer than --checkpoint-min-tokens leaves a prompt_end checkpoint
    _greedy_chat(served, LONG_TEXT + " checkpoint me", max_tokens=2)
    listing = json.loads(cli(served, "checkpoints", "ls", "--json").stdout)
    assert listing["object"] == "list" and listing["data"]
    row = listing["data"][0]
    assert {"id", "tokens", "kind", "bytes", "tier", "hits", "last_used"} <= set(row)
    r = cli(served, "checkpoints", "ls")
    assert r.returncode == 0, r.stderr
    header, *rows = r.stdout.splitlines()
    assert header.split() == ["ID", "TOKENS", "KIND", "BYTES", "OWN", "SHARED", "TIER", "HITS", "LAST", "USE"]
    assert any(ln.split()[0] == row["id"] and ln.split()[1] == str(row["tokens"]) for ln in rows)

    r = cli(served, "checkpoints", "rm", row["id"])
    assert r.returncode == 0 and r.stdout.strip() == f"deleted {row['id']}", r.stderr
    ids = [d["id"] for d in json.loads(cli(served, "checkpoints", "ls", "--json").stdout)["data"]]
    assert row["id"] not in ids
    r = cli(served, "checkpoints", "rm", row["id"])
    assert r.returncode == 1 and "404" in r.stderr and row["id"] in r.stderr


def _scrape(sock) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    with _http(sock) as c:
        r = c.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def test_metrics_parse_and_move_with_requests(served):
    before = _scrape(served)
    out = _greedy_chat(served, "metrics please " * 20, max_tokens=3)
    after = _scrape(served)
    done = ("cairn_requests_total", (("outcome", "done"),))
    computed = ("cairn_prefill_tokens_total", (("kind", "computed"),))
    ttft = ("cairn_ttft_seconds_count", ())
    assert after[done] == before[done] + 1
    cached = out["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert after[computed] - before[computed] == out["usage"]["prompt_tokens"] - cached
    assert after[ttft] == before[ttft] + 1
    assert after[("cairn_live_state_tokens", ())] == out["usage"]["prompt_tokens"] + 2


def test_unreachable_daemon_is_one_clear_line(tmp_path):
    path = tmp_path / "nobody.sock"
    for args in (["status"], ["chat", "hi"], ["checkpoints", "ls"], ["checkpoints", "rm", "x"]):
        r = cli(path, *args)
        assert r.returncode == 1
        assert r.stderr.strip().endswith(f"cannot reach cairn at {path}: is the daemon running? Start it "
                                         "with `make serve` in the cairn checkout, or `cairn serve --model "
                                         "DIR_OR_GGUF`; as a service: `systemctl status cairn`"), r.stderr
        assert "Traceback" not in r.stderr


def test_interactive_chat_keeps_the_conversation(served):
    import pty
    import termios

    q1, q2 = "What is a cairn?", "And why build one?"
    a1 = _greedy_chat(served, q1, max_tokens=6, system=None)["choices"][0]["message"]["content"]
    with _http(served) as c:
        r = c.post("/v1/chat/completions", json={
            "model": "tiny", "temperature": 0, "max_tokens": 6,
            "messages": [{"role": "user", "content": q1}, {"role": "assistant", "content": a1},
                         {"role": "user", "content": q2}]})
    a2 = r.json()["choices"][0]["message"]["content"]

    master, slave = pty.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[3] &= ~termios.ECHO
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    env = {**os.environ, "PYTHONIOENCODING": "utf-8", "CAIRN_SOCKET": str(served)}
    proc = subprocess.Popen(CAIRN + ["chat", "--temperature", "0", "--max-tokens", "6"], stdin=slave,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    os.close(slave)
    try:
        os.write(master, f"{q1}\n{q2}\n".encode() + b"\x04")       # two turns, then Ctrl-D
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    text = out.decode()
    assert a1 in text and a2 in text and text.index(a1) < text.rindex(a2)
    assert "Ctrl-D quits" in err.decode()
