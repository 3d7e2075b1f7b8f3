"""The HTTP edge with the fake kernel (tests/fake_kernel.py): refused requests are logged, a chat is
tokenized once, prompts that cannot fit are refused by their size before tokenizing, a trailing
assistant message is continued, and a long prefill progresses across a client's retries."""

from __future__ import annotations

import trio
from structlog.testing import capture_logs

from daemon_harness import daemon, fake_loaded, request

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


async def test_a_refused_request_leaves_one_info_line_with_the_reason_and_not_the_body(tiny_model_dir, tmp_path):
    loaded = fake_loaded(tiny_model_dir)
    sock = tmp_path / "c.sock"
    secret = "do-not-log-this-text"
    with trio.fail_after(30), capture_logs() as logs:
        async with daemon(loaded, sock):
            r = await request(sock, "POST", "/v1/chat/completions",
                              {**CHAT, "messages": [{"role": "user", "content": secret}], "temperature": 3})
    assert r.status == 400
    (line,) = [e for e in logs if e["event"] == "request_rejected"]
    assert line["log_level"] == "info" and line["status"] == 400 and line["param"] == "temperature"
    assert line["code"] == r.json()["error"]["code"] and line["message"] == r.json()["error"]["message"]
    assert line["path"] == "/v1/chat/completions"
    assert not any(secret in repr(e) for e in logs)
