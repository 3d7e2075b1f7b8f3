"""Work at the HTTP edge that must not block the event loop or outlive its request (issue 10,
item 5): oversized bodies are refused before they are read, large bodies are parsed in a thread,
token-id prompts are checked against the context before their ids are read, and a cancelled chat
request waits for its own tokenization thread instead of abandoning it."""

from __future__ import annotations

import json
import threading

import pytest
import trio
import trio.testing

from cairn.daemon.api import app as api_module
from cairn.daemon.api.app import API
from cairn.daemon.protocol.chat import RenderedChat
from cairn.daemon.api.asgi import MAX_BODY
from cairn.daemon.service.logs import get_logger
from cairn.daemon.api.schemas import APIError, parse_completion


class _Tok:
    eos_id = None

    def encode(self, text):
        return [1] * max(1, len(text) // 4)

    def encode_with_offsets(self, text):
        ids = self.encode(text)
        return ids, [min(4 * (i + 1), len(text.encode())) for i in range(len(ids))]

    def decode(self, ids):
        return ""

    def template_markers(self):
        return None          # no chat template markers: no capture candidates read from ids


def _api(renderer=None, ctx: int = 4096) -> API:
    inbox, _ = trio.open_memory_channel(16)
    return API(inbox=inbox, tokenizer=_Tok(), renderer=renderer, model_id="tiny", context_length=ctx,
               vocab_size=64, max_tokens_default=16, fingerprint="f" * 16, log=get_logger())


def _scope(path: str, length: int | None) -> dict:
    headers = [] if length is None else [(b"content-length", str(length).encode())]
    return {"type": "http", "method": "POST", "path": path, "server": None, "headers": headers}


def _one_body(body: bytes):
    """An ASGI `receive` that hands over `body` once, then waits as a connected client does."""
    sent = False

    async def receive():
        nonlocal sent
        if sent:
            await trio.sleep_forever()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


class _Sink:
    def __init__(self) -> None:
        self.msgs: list[dict] = []

    async def __call__(self, msg) -> None:
        self.msgs.append(msg)

    @property
    def status(self) -> int:
        return next(m["status"] for m in self.msgs if m["type"] == "http.response.start")

    def json(self) -> dict:
        return json.loads(b"".join(m.get("body", b"") for m in self.msgs if m["type"] == "http.response.body"))


async def test_body_over_the_limit_by_content_length_is_refused_before_it_is_read(autojump_clock):
    async def receive():                        # the client would now send 100 MiB: never read
        await trio.sleep_forever()

    sink = _Sink()
    with trio.fail_after(60):
        await _api()(_scope("/v1/chat/completions", 100 << 20), receive, sink)
    assert sink.status == 413
    err = sink.json()["error"]
    assert err["code"] == "body_too_large"
    assert str(100 << 20) in err["message"] and str(MAX_BODY) in err["message"]


async def test_large_body_is_parsed_off_the_event_loop(monkeypatch):
    threads = []
    real = api_module.parse_json_body

    def spy(raw):
        threads.append(threading.current_thread())
        return real(raw)

    monkeypatch.setattr(api_module, "parse_json_body", spy)
    body = json.dumps({"model": "other", "messages": [{"role": "user", "content": "x" * (2 << 20)}]}).encode()
    receive = _one_body(body)

    sink = _Sink()
    with trio.fail_after(60):
        await _api()(_scope("/v1/chat/completions", len(body)), receive, sink)
    assert sink.status == 404                   # parsed (then the model was wrong)
    assert threads and threads[0] is not threading.main_thread()


class _NoReading(list):
    """A token list whose ids must not be looked at (only its length)."""

    def __iter__(self):
        raise AssertionError("the token ids were read before the context-length check")


def test_token_prompt_over_the_context_is_refused_before_its_ids_are_read():
    prompt = _NoReading([0] * 5000)
    with pytest.raises(APIError) as e:
        parse_completion({"model": "tiny", "prompt": prompt}, context_length=4096)
    assert e.value.status == 400 and e.value.code == "context_length_exceeded"
    assert e.value.message == "prompt: the prompt is 5000 tokens; this model's context is 4096 tokens"


class _BlockingRenderer:
    """Rendering that runs until the test releases it (a long conversation being tokenized)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()

    def render(self, messages, tools=None, options=None):
        self.entered.set()
        self.release.wait(60)
        self.finished.set()
        return RenderedChat("hello", None)


async def test_cancelled_chat_request_waits_for_its_tokenization_thread():
    renderer = _BlockingRenderer()
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}).encode()
    receive = _one_body(body)

    ended_with_thread_running = None
    try:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                scope = trio.CancelScope()

                async def handler():
                    nonlocal ended_with_thread_running
                    with scope:
                        await _api(renderer)(_scope("/v1/chat/completions", len(body)), receive, _Sink())
                    ended_with_thread_running = not renderer.finished.is_set()

                nursery.start_soon(handler)
                assert await trio.to_thread.run_sync(renderer.entered.wait, 30), "rendering never started"
                scope.cancel()                  # the client went away (or the daemon is stopping)
                await trio.testing.wait_all_tasks_blocked()
                assert ended_with_thread_running is None    # still waiting for its thread
                renderer.release.set()
    finally:
        renderer.release.set()
    assert ended_with_thread_running is False


def test_no_max_tokens_means_the_rest_of_the_context_unless_the_operator_set_a_default():
    inbox, _ = trio.open_memory_channel(16)
    unset = API(inbox=inbox, tokenizer=_Tok(), renderer=None, model_id="tiny", context_length=4096,
                vocab_size=64, max_tokens_default=None, fingerprint="f" * 16, log=get_logger())
    assert unset._budget(1000, None, "messages") == 4096 - 1000
    assert unset._budget(1000, 7, "messages") == 7
    assert _api(ctx=4096)._budget(1000, None, "prompt") == 16          # the operator's default
    assert _api(ctx=1010)._budget(1000, None, "prompt") == 10          # still bounded by the context


async def test_large_bodies_are_read_two_at_a_time():
    """Three clients each sending a 2 MiB body: two are read, the third waits (bounded memory)."""
    reading = []

    def slow_body(i):
        async def receive():
            reading.append(i)
            await trio.sleep_forever()        # the client is still sending
        return receive

    with trio.fail_after(30):
        api = _api()
        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(api, _scope("/v1/chat/completions", 2 << 20), slow_body(i), _Sink())
            await trio.testing.wait_all_tasks_blocked()
            assert len(reading) == 2
            nursery.cancel_scope.cancel()


async def test_bodies_being_read_hold_at_most_the_memory_plans_bytes_for_them():
    """Issue 40 §3: every body, small ones too, holds its bytes of the plan's room for bodies (here
    2.5 MiB) until parsed: two 1 MiB bodies are read, the third waits; a body of unknown length waits
    for the whole room, and one declared larger than the room is refused (413) before it is read."""
    reading = []

    def slow_body(i):
        async def receive():
            reading.append(i)
            await trio.sleep_forever()        # the client is still sending
        return receive

    inbox, _ = trio.open_memory_channel(16)
    api = API(inbox=inbox, tokenizer=_Tok(), renderer=None, model_id="tiny", context_length=4096, vocab_size=64,
              max_tokens_default=16, fingerprint="f" * 16, log=get_logger(), body_bytes=5 << 19)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(api, _scope("/v1/chat/completions", 1 << 20), slow_body(i), _Sink())
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(api, _scope("/v1/chat/completions", None), slow_body("chunked"), _Sink())
            await trio.testing.wait_all_tasks_blocked()
            assert len(reading) == 2 and "chunked" not in reading          # any two of the three 1 MiB ones
            assert api.bodies.free == (5 << 19) - (2 << 20)
            big = _Sink()
            await api(_scope("/v1/chat/completions", 3 << 20), slow_body("big"), big)
            assert big.status == 413 and "big" not in reading
            nursery.cancel_scope.cancel()
    assert api.bodies.free == 5 << 19                      # every byte given back
