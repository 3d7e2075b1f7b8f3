"""Every malformed request gets its 4xx naming the field, and the daemon keeps serving; SIGTERM
during a long prefill exits 0 promptly (a real `cairn serve` process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

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
    sock = tmp_path / "c.sock"
    proc = subprocess.Popen([sys.executable, "-m", "cairn.daemon.cli", "serve", "--model", str(tiny_model_dir),
                             "--socket", str(sock), "--chunk", "32"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "CAIRN_LOG_LEVEL": "info"})
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        prompt = [int(t) for t in np.random.default_rng(3).integers(20, 500, size=20000)]

        async def start_prefill():
            s = await open_request(sock, "POST", "/v1/completions", {"model": "tiny", "prompt": prompt})
            await trio.sleep(0.8)                         # well inside the prefill (~10 s in all)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            data = b""
            with trio.move_on_after(10):
                while chunk := await s.receive_some(65536):
                    data += chunk
            return t0

        t0 = trio.run(start_prefill)
        rc = proc.wait(timeout=10)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    out = proc.stdout.read()
    assert rc == 0, out
    assert elapsed < 3.0, f"exit took {elapsed:.2f}s"
    assert "shutting_down" in out and "prefill_plan" in out
    assert '"outcome": "done"' not in out
