"""Every request ends (issue 10, items 2 and 3): a terminal reply that finds a stalled client's buffer
full still reaches the handler, /v1/status tells the truth meanwhile, and a kernel error or a
shutdown in the middle of a kernel call ends the request as itself (never as an ExceptionGroup).

The engine runs with the fake kernel; the HTTP edge is the ASGI app called directly, with a `send`
that stops taking bytes (a client that stopped reading) until the test lets it go.
"""

from __future__ import annotations

import json
import types

import numpy as np
import trio
import trio.testing
from structlog.testing import capture_logs

import fake_kernel
from daemon_harness import fake_loaded

from cairn.actors.engine.engine import Engine
from cairn.actors.engine.kernel_thread import clocked
from cairn.actors.engine.messages import CancelAck, Failed, Progress, RequestControl, Sampling, Submit
from cairn.actors.engine.replies import STALL_S
from cairn.actors.engine.trim import IdleTrim
from cairn.actors.engine.wiring import start_engine
from cairn.daemon.api.app import REPLY_BUFFER, API
from cairn.daemon.service.logs import get_logger
from cairn.daemon.service.metrics import Metrics
from cairn.daemon.api.status import StatusBoard
from cairn.daemon.protocol.tokenizer import StreamDecoder


class InlineRunner:
    """Kernel calls inline (the fake kernel is instant): no threads, so the mock clock is exact."""

    async def run(self, fn, *args, abortable=False, tally=None, **kwargs):
        await trio.lowlevel.checkpoint()
        if abortable:
            kwargs["abort"] = fake_kernel.AbortFlag()
        return fn(*args, **kwargs)

    async def decode(self, kernel, state, token, spent, tally=None):
        return await self.run(clocked(kernel.decode, spent), state, token)


class StalledClient:
    """ASGI receive/send of a client that sent its request, then stopped reading until `resume`."""

    def __init__(self, body: dict) -> None:
        self.body = json.dumps(body).encode()
        self.sent_request = False
        self.resume = trio.Event()
        self.out: list[dict] = []
        self.done = trio.Event()

    async def receive(self):
        if not self.sent_request:
            self.sent_request = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await trio.sleep_forever()        # still connected

    async def send(self, msg):
        if msg["type"] == "http.response.body":
            await self.resume.wait()
        self.out.append(msg)

    def text(self) -> str:
        return b"".join(m.get("body", b"") for m in self.out if m["type"] == "http.response.body").decode()

    def events(self) -> list:
        blocks = [b[6:] for b in self.text().split("\n\n") if b.startswith("data: ")]
        return [b if b == "[DONE]" else json.loads(b) for b in blocks]


def _scope(path: str, body: bytes = b"", headers=()) -> dict:
    return {"type": "http", "method": "POST", "path": path, "server": None,
            "headers": [(b"content-length", str(len(body)).encode()), *headers]}


async def _inline(fn):
    return fn()


async def _start(nursery, loaded, *, inline: bool = True, metrics=None, **engine_kw):
    engine = Engine(loaded.kernel, loaded.model, loaded.tokenizer, loaded.context_length, metrics=metrics,
                    **engine_kw)
    if inline:
        engine.runner = InlineRunner()
    idle = trio.Event()
    engine.announce = lambda text: idle.set() if text.startswith("idle") else None
    log = get_logger()
    # the idle trim runs inline: on the autojump clock a worker thread would let virtual time leap past the test's bounds
    inbox = await start_engine(nursery, engine, queue_size=4, log=log, trim=IdleTrim(log, in_thread=_inline),
                               new_stream_decoder=lambda: StreamDecoder(loaded.tokenizer))
    status = StatusBoard(engine, queue_size=4, fingerprint="f" * 16, context_length=loaded.context_length)
    api = API(inbox=inbox, tokenizer=loaded.tokenizer, renderer=loaded.renderer, model_id="tiny",
              context_length=loaded.context_length, vocab_size=int(loaded.model.vocab_size),
              max_tokens_default=16, fingerprint="f" * 16, log=log, status=status)
    return engine, api, status, idle


async def _stalled_request(tiny_model_dir, max_tokens: int, away_s: float):
    """A streamed request whose client stops reading at once and comes back after `away_s`."""
    loaded = fake_loaded(tiny_model_dir)
    body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}
    client = StalledClient(body)
    with trio.fail_after(10 * STALL_S), capture_logs():
        async with trio.open_nursery() as nursery:
            engine, api, status, idle = await _start(nursery, loaded)

            async def handler():
                await api(_scope("/v1/completions", client.body), client.receive, client.send)
                client.done.set()

            nursery.start_soon(handler)
            await idle.wait()                       # the engine has ended the request
            snap = status.snapshot("tiny")
            await trio.sleep(away_s)                # the client is still away (mock clock)
            client.resume.set()
            await client.done.wait()                # hangs (fail_after) if the stream never ends
            after = status.snapshot("tiny")
            nursery.cancel_scope.cancel()
    return client, snap, after


async def test_stalled_streaming_client_that_resumes_gets_a_terminated_stream_and_status_shows_idle(
        tiny_model_dir, autojump_clock):
    # More tokens than the reply buffer holds: decode waits for room, gives up after STALL_S and
    # cancels; the CancelAck finds the buffer full.
    client, snap, after = await _stalled_request(tiny_model_dir, max_tokens=4 * REPLY_BUFFER, away_s=1.0)
    assert snap["running"] is None and snap["queue"]["depth"] == 0     # engine idle: status says so
    assert after["running"] is None
    events = client.events()
    assert events[-1] == "[DONE]"
    err = events[-2]["error"]
    assert err["code"] == "client_stalled" and f"{STALL_S:.0f} s" in err["message"]


async def test_done_that_found_a_stalled_clients_buffer_full_still_ends_its_stream(tiny_model_dir, autojump_clock):
    # Exactly enough tokens to fill the buffer (the handler holds the first Progress): the Done has no
    # room, and the client comes back long after the engine would have stopped waiting for it.
    client, snap, after = await _stalled_request(tiny_model_dir, max_tokens=REPLY_BUFFER - 1, away_s=2 * STALL_S)
    assert snap["running"] is None and after["running"] is None
    events = client.events()
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert "error" not in client.text()


def _kernel_with(prefill) -> types.SimpleNamespace:
    return types.SimpleNamespace(**{k: getattr(fake_kernel, k) for k in ("AbortFlag", "State", "decode")},
                                 prefill=prefill)


async def _submit(inbox, rid: str, prompt, max_tokens: int = 4):
    send, recv = trio.open_memory_channel(REPLY_BUFFER)
    sub = Submit(rid, tuple(prompt), None, Sampling(max_tokens=max_tokens, temperature=0), False, send,
                 RequestControl())
    await inbox.send(sub)
    return sub, recv


async def test_kernel_value_error_mid_prefill_fails_the_request_as_value_error(tiny_model_dir):
    def prefill(state, tokens, *, chunk=128, abort=None, all_logits=False):
        if state.n_tokens >= 4:                      # the second segment: mid-prefill
            raise ValueError("prefill: bad chunk (fake)")
        return fake_kernel.prefill(state, tokens, chunk=chunk, abort=abort, all_logits=all_logits)

    loaded = fake_loaded(tiny_model_dir)
    loaded.kernel = _kernel_with(prefill)
    with trio.fail_after(30), capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            engine, api, status, idle = await _start(nursery, loaded, inline=False, segment=4, chunk=4)
            sub, recv = await _submit(api.inbox, "r1", range(10, 22))
            async for final in recv:                # the last reply before the channel closes
                if not isinstance(final, Progress):
                    break
            nursery.cancel_scope.cancel()
    assert isinstance(final, Failed) and sub.control.final == final
    assert final.message == "ValueError: prefill: bad chunk (fake)"
    assert not any(e["event"] == "prefill_bug" for e in logs)
    assert engine.slots[0].state is None            # the state after a kernel error is never reused


async def test_shutdown_during_a_kernel_call_logs_the_cancelled_request_and_counts_it(tiny_model_dir):
    entered = trio.Event()
    token = None

    def prefill(state, tokens, *, chunk=128, abort=None, all_logits=False):
        trio.from_thread.run_sync(entered.set, trio_token=token)
        abort._e.wait()                              # runs until the abort flag stops it
        return 0, np.zeros(state.model.vocab_size, np.float32)

    loaded = fake_loaded(tiny_model_dir)
    loaded.kernel = _kernel_with(prefill)
    metrics = Metrics()
    with trio.fail_after(30), capture_logs() as logs:
        token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            engine, api, status, idle = await _start(nursery, loaded, inline=False, metrics=metrics)
            sub, recv = await _submit(api.inbox, "r1", range(10, 22))
            await entered.wait()
            nursery.cancel_scope.cancel()            # SIGTERM: the daemon's nursery is cancelled
    lines = [e for e in logs if e["event"] == "request"]
    assert [(e["request_id"], e["outcome"], e.get("error")) for e in lines] == [("r1", "cancelled", "shutdown")]
    assert metrics.cancels.value() == 1 and metrics.requests.value(outcome="cancelled") == 1
    assert sub.control.final == CancelAck("r1", "shutdown")   # the handler answers at once


async def test_request_end_closes_the_reply_channel(tiny_model_dir):
    loaded = fake_loaded(tiny_model_dir)
    with trio.fail_after(30), capture_logs():
        async with trio.open_nursery() as nursery:
            engine, api, status, idle = await _start(nursery, loaded)
            sub, recv = await _submit(api.inbox, "r1", [1, 2, 3], max_tokens=3)
            replies = [m async for m in recv]
            nursery.cancel_scope.cancel()
    assert isinstance(replies[0], Progress) and replies[-1] == sub.control.final
