"""Tokens that queued up while the HTTP handler was writing go out in one write (issue 41 §5).

The handler takes a token, then every token already waiting behind it, and sends their SSE events as
one body message (api/asgi.Coalesced): the stream's bytes are those of one write a token. A client
that stops reading makes the tokens queue; when it reads again, the rest of the reply must arrive
in a few writes and say exactly what the same request answers in one JSON body.
"""

from __future__ import annotations

import json

import trio
from structlog.testing import capture_logs

from daemon_harness import fake_loaded
from test_request_end import StalledClient, _scope, _start

N = 40      # fewer than the reply buffer holds: the request is not cancelled for stalling


async def _post(api, body: dict) -> StalledClient:
    client = StalledClient(body)
    client.resume.set()
    await api(_scope("/v1/completions", client.body), client.receive, client.send)
    return client


async def test_tokens_queued_behind_a_slow_write_go_out_together_with_the_same_text(tiny_model_dir, autojump_clock):
    loaded = fake_loaded(tiny_model_dir)
    body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": N, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    with trio.fail_after(600), capture_logs():
        async with trio.open_nursery() as nursery:
            engine, api, status, idle = await _start(nursery, loaded)
            client = StalledClient(body)

            async def handler():
                await api(_scope("/v1/completions", client.body), client.receive, client.send)
                client.done.set()

            nursery.start_soon(handler)
            await idle.wait()                       # the engine has decoded every token meanwhile
            client.resume.set()
            await client.done.wait()
            whole = await _post(api, {**body, "stream": False})
            nursery.cancel_scope.cancel()
    events = client.events()
    assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == N
    streamed = "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])
    assert streamed == json.loads(whole.text())["choices"][0]["text"]
    writes = [m for m in client.out if m["type"] == "http.response.body"]
    # the first token's write (the one the client stalled on), the N - 1 queued behind it, the end
    assert len(writes) <= 6, f"{len(writes)} writes for {N} tokens"
