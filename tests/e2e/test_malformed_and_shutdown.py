"""Every malformed request gets its 4xx naming the field, and the daemon keeps serving; SIGTERM
during a long prefill exits 0 promptly (a real `cairn serve` process)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
import trio
from structlog.testing import capture_logs

from daemon_harness import daemon, open_request, real_loaded, request


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
CMPL = {"model": "tiny", "prompt": "hello", "max_tokens": 2}

CASES = [
    # (path, body, status, param)
    ("/v1/chat/completions", b"{not json", 400, None),
    ("/v1/chat/completions", b'{"model": "tiny", "messages": "\xff\xfe"}', 400, None),
    ("/v1/chat/completions", b"[1, 2]", 400, None),
    ("/v1/chat/completions", {**CHAT, "model": "other"}, 404, "model"),
    ("/v1/chat/completions", {k: v for k, v in CHAT.items() if k != "model"}, 400, "model"),
    ("/v1/chat/completions", {**CHAT, "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    ("/v1/chat/completions", {**CHAT, "temperature": "hot"}, 400, "temperature"),
    ("/v1/chat/completions", {**CHAT, "temperature": 3}, 400, "temperature"),
    ("/v1/chat/completions", {**CHAT, "top_p": 0}, 400, "top_p"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 10**9}, 400, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_token": 5}, 400, "max_token"),
    ("/v1/chat/completions", {**CHAT, "stream": "yes"}, 400, "stream"),
    ("/v1/chat/completions", {**CHAT, "n": 2}, 400, "n"),
    ("/v1/chat/completions", {**CHAT, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ("/v1/chat/completions", {**CHAT, "stop": ["a", "b" * 1025]}, 400, "stop[1]"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 3}, 400, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
    ("/v1/completions", {**CMPL, "prompt": 5}, 400, "prompt"),
    ("/v1/completions", {**CMPL, "prompt": [1, "a"]}, 400, "prompt"),
    ("/v1/completions", {**CMPL, "prompt": [1, 10**6]}, 400, "prompt"),
    ("/v1/completions", {**CMPL, "prompt": ""}, 400, "prompt"),
    ("/v1/completions", {**CMPL, "prompt": [5] * 70000}, 400, "prompt"),
    ("/v1/completions", {**CMPL, "logprobs": 21}, 400, "logprobs"),
    ("/v1/completions", {**CMPL, "max_tokens": -1}, 400, "max_tokens"),
    ("/v1/completions", {**CMPL, "seed": 1.5}, 400, "seed"),
    ("/v1/nothing", CMPL, 404, None),
    # issue 22 item 5: each of these was a 500
    ("/v1/chat/completions", b"[" * 100_000, 400, None),
    ("/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": "user", "content": "a\\ud800"}]}', 400,
     "messages[0].content"),
    ("/v1/completions", b'{"model": "tiny", "prompt": "\\udfff"}', 400, "prompt"),
    ("/v1/completions", b'{"model": "tiny", "prompt": "x", "stop": ["\\ud83d"]}', 400, "stop[0]"),
    ("/v1/chat/completions", json.dumps(CHAT)[:-1].encode() + b', "temperature": NaN}', 400, "temperature"),
    ("/v1/chat/completions", json.dumps(CHAT)[:-1].encode() + b', "top_p": Infinity}', 400, "top_p"),
    ("/v1/chat/completions", json.dumps(CHAT)[:-1].encode() + b', "logit_bias": {"5": NaN}}', 400, "logit_bias.5"),
    ("/v1/completions", b'{"model": "tiny", "prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}", 400, None),
    ("/v1/completions", {**CMPL, "seed": 10**100}, 400, "seed"),
    ("/v1/completions", {**CMPL, "prompt": [1, 10**100]}, 400, "prompt[1]"),
    ("/v1/chat/completions", {**CHAT, "logit_bias": {"9" * 5000: 1}}, 400, "logit_bias"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": [1]}],
                              "tool_choice": {"type": "function", "function": {"name": "f"}}}, 400, "tools[0].function"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {}}, "required": ["a", 1]}}}], "tool_choice": "required"}, 400,
     "tools[0].function.parameters.required[1]"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": ["a"]}}}]}, 400, "tools[0].function.parameters.properties"),
    *[("/v1/chat/completions", {**CHAT, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": args}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}, 400, "messages[1].tool_calls[0].function.arguments")
      for args in ('{"a": "\\ud800"}', "[" * 100_000)],     # JSON inside a string: parsed by the encoder
    ("/v1/chat/completions", {**CHAT, "tool_choice": "required", "tools": [
        {"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object", "properties": {
            "a": {"type": "integer"}}, "required": ["a"]}}} for i in range(10_000)]}, 400, "messages"),
    # (10,000 tools make a prompt of ~900,000 tokens: refused for the context before any grammar is
    # compiled for them, which took seconds)
]


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return real_loaded(tiny_model_dir)


async def test_malformed_requests_get_4xx_and_daemon_keeps_serving(loaded, tmp_path):
    sock = tmp_path / "c.sock"
    with trio.fail_after(60), capture_logs():
        async with daemon(loaded, sock):
            for path, body, status, param in CASES:
                r = await request(sock, "POST", path, body)
                assert r.status == status, (path, body if not isinstance(body, dict) else param, r.body[:200])
                err = r.json()["error"]
                assert set(err) == {"message", "type", "param", "code"}
                assert err["param"] == param, (param, err)
                if param:
                    assert param in err["message"]
                assert r.status < 500 and "panic" not in err["message"] and "Traceback" not in err["message"]
                ok = await request(sock, "POST", "/v1/completions", CMPL)
                assert ok.status == 200, ok.body
            assert (await request(sock, "GET", "/v1/models/other")).status == 404
            assert (await request(sock, "GET", "/health")).json()["status"] == "ok"


async def test_socket_mode_is_0660(loaded, tmp_path):
    sock = tmp_path / "sub" / "c.sock"
    with trio.fail_after(30), capture_logs():
        async with daemon(loaded, sock):
            assert (os.stat(sock).st_mode & 0o777) == 0o660


def test_sigterm_during_long_prefill_exits_zero_promptly(tiny_model_dir, tmp_path):
    """SIGTERM once the prefill is under way: exit 0 with the prompt far from done. "Promptly" is
    shown by where the kernel stopped, not by a clock: the daemon does not wait for the prefill."""
    sock = tmp_path / "c.sock"
    segment, chunk = 256, 32
    prompt = [int(t) for t in np.random.default_rng(3).integers(20, 500, size=60000)]
    proc = subprocess.Popen([sys.executable, "-m", "cairn.daemon.cli.main", "serve", "--slots", "1", "--model", str(tiny_model_dir),
                             "--socket", str(sock), "--chunk", str(chunk), "--segment", str(segment)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "CAIRN_LOG_LEVEL": "info"})
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()

    def events(name: str) -> list[dict]:
        out = []
        for ln in list(lines):
            if ln.startswith("{") and f'"{name}"' in ln:
                e = json.loads(ln)
                if e.get("event") == name:
                    out.append(e)
        return out

    async def start_prefill():
        with trio.fail_after(60):                              # a hang guard, not a speed requirement
            while not events("listening"):                     # the socket file alone may not accept yet
                assert proc.poll() is None, "".join(lines)
                await trio.sleep(0.01)
            s = await open_request(sock, "POST", "/v1/completions", {"model": "tiny", "prompt": prompt})
            while not events("prefill_segment"):               # the kernel is well inside the prompt
                assert proc.poll() is None, "".join(lines)
                await trio.sleep(0.01)
            proc.send_signal(signal.SIGTERM)
            while await s.receive_some(65536):
                pass

    try:
        trio.run(start_prefill)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    out = "".join(lines)
    assert rc == 0, out
    names = [e["event"] for e in (json.loads(ln) for ln in lines if ln.startswith("{"))]
    assert names.index("prefill_plan") < names.index("shutting_down") < names.index("stopped")
    assert not events("request") or all(e["outcome"] != "done" for e in events("request"))
    done = [e["tokens_done"] for e in events("prefill_segment")]
    # stopped at a segment or chunk boundary, with nearly all of the 60000-token prompt still to go
    assert done and all(d % chunk == 0 for d in done) and max(done) <= len(prompt) // 4, done


STUCK_DAEMON = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from daemon_harness import fake_loaded
from cairn.daemon.service.config import load_settings
from cairn.daemon.service.logs import configure_logging
from cairn.daemon.service.main import serve
configure_logging(json=True)
settings = load_settings({{"model": {model!r}, "socket": {sock!r}, "slots": 1, "shutdown_timeout_s": 2,
                          "checkpoints": False, "speculate": "off"}}, {{}})
# every prefill chunk sleeps an hour, deaf to the abort flag: a kernel call that does not come back
sys.exit(serve(settings, load_model=lambda s: fake_loaded(Path({model!r}), chunk_delay=3600)))
"""


def test_sigterm_with_a_kernel_call_that_never_returns_exits_1_with_the_stacks(tiny_model_dir, tmp_path):
    """The shutdown bound (daemon/service/shutdown.py): a stop that cannot finish (here a kernel call
    that ignores its abort flag) ends the process after shutdown_timeout_s with exit 1, a
    `shutdown_timeout` log line and every thread's stack, instead of hanging for good."""
    sock = tmp_path / "c.sock"
    script = STUCK_DAEMON.format(tests=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                 model=str(tiny_model_dir), sock=str(sock))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "CAIRN_LOG_LEVEL": "info"})
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()

    async def stop_mid_chunk():
        with trio.fail_after(60):                              # a hang guard, not a speed requirement
            while not any('"listening"' in ln for ln in list(lines)):
                assert proc.poll() is None, "".join(lines)
                await trio.sleep(0.01)
            s = await open_request(sock, "POST", "/v1/completions", {"model": "tiny", "prompt": [5, 6, 7]})
            while not any('"prefill_plan"' in ln for ln in list(lines)):   # the hour-long chunk has begun
                assert proc.poll() is None, "".join(lines)
                await trio.sleep(0.01)
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                while await s.receive_some(65536):
                    pass

    try:
        trio.run(stop_mid_chunk)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    out = "".join(lines)
    assert rc == 1, out
    events = [json.loads(ln) for ln in lines if ln.startswith("{")]
    names = [e.get("event") for e in events]
    assert "shutting_down" in names and "shutdown_timeout" in names, out
    assert names.index("shutting_down") < names.index("shutdown_timeout")
    assert "stopped" not in names                              # it did not stop by itself
    assert "Thread 0x" in out and "(most recent call first)" in out
    assert 'File "' in out and "in prefill" in out, out[-3000:]   # the stuck kernel call is named
