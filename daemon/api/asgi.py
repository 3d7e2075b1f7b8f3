"""Tiny plain-ASGI helpers: read a bounded body, send JSON / errors / SSE events."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from typing import AsyncIterator

import trio

from .schemas import APIError

MAX_BODY = 64 * 1024 * 1024


def too_large(limit: int, size: int | None = None) -> APIError:
    got = f" ({size} bytes)" if size is not None else ""
    return APIError(413, f"request body too large{got}; at most {limit} bytes ({limit >> 20} MiB) are accepted",
                    code="body_too_large")


def declared_length(scope) -> int | None:
    """The request's Content-Length, or None when absent or not a number (chunked bodies)."""
    for k, v in scope.get("headers") or ():
        if k.lower() == b"content-length":
            try:
                return int(v)
            except ValueError:
                return None
    return None


async def read_body(receive, limit: int = MAX_BODY, scope=None) -> bytes:
    """The whole body, refused with 413 before anything is read when its Content-Length says it is
    over `limit`, and as soon as the bytes received pass `limit` otherwise (chunked, or a lying header)."""
    if scope is not None:
        n = declared_length(scope)
        if n is not None and n > limit:
            raise too_large(limit, n)
    parts, size = [], 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ConnectionAbortedError
        body = msg.get("body", b"")
        size += len(body)
        if size > limit:
            raise too_large(limit)
        parts.append(body)
        if not msg.get("more_body"):
            return b"".join(parts)


class BodyBytes:
    """A byte semaphore: request bodies being read and parsed take their bytes of `capacity` (the memory
    plan's `body_bytes`) until parsed, so what they hold at once is bounded whatever the number of
    clients; waiters are served first come, first served. A body of unknown length takes the most it
    may be. A body larger than the whole capacity is refused (413) before anything is read."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, int(capacity))
        self.free = self.capacity
        self._order = trio.Lock()           # fair: the first waiter gets the next freed bytes
        self._freed = trio.Event()

    def limit(self, limit: int = MAX_BODY) -> int:
        """The largest body accepted: the protocol's limit, or the whole capacity when smaller."""
        return min(limit, self.capacity)

    @asynccontextmanager
    async def hold(self, nbytes: int) -> AsyncIterator[None]:
        n = max(0, int(nbytes))
        if n > self.capacity:
            raise APIError(413, f"request body of {n} bytes is larger than the memory plan leaves for request "
                           f"bodies ({self.capacity} bytes at once)", code="body_too_large")
        async with self._order:
            while self.free < n:
                await self._freed.wait()
            self.free -= n
        try:
            yield
        finally:
            self.free += n
            self._freed.set()
            self._freed = trio.Event()


def _dumps(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


async def send_json(send, status: int, obj, headers: dict[str, str] | None = None) -> None:
    body = _dumps(obj)
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    hdrs += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body})


async def send_error(send, err: APIError) -> None:
    await send_json(send, err.status, err.body(), err.headers)


async def start_sse(send) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
                            (b"x-accel-buffering", b"no")]})


async def send_event(send, obj) -> None:
    await send({"type": "http.response.body", "body": b"data: " + _dumps(obj) + b"\n\n", "more_body": True})


async def send_comment(send, text: str) -> None:
    """An SSE comment line (`: text`): clients that follow the SSE spec, the openai ones too, skip it."""
    await send({"type": "http.response.body", "body": b": " + text.encode() + b"\n\n", "more_body": True})


class Coalesced:
    """An ASGI `send` that holds streamed body pieces (`more_body`) until `flush`, which sends them as
    one message: the bytes on the socket are the same, in one write instead of one per piece. Any
    other message flushes first and goes through. For tokens that queued up while the handler wrote
    (daemon/api/app.py): one write for all of them."""

    def __init__(self, send) -> None:
        self._send = send
        self._parts: list[bytes] = []

    async def __call__(self, message) -> None:
        if message["type"] == "http.response.body" and message.get("more_body"):
            self._parts.append(message["body"])
            return
        await self.flush()
        await self._send(message)

    async def flush(self) -> None:
        if self._parts:
            body, self._parts = b"".join(self._parts), []
            await self._send({"type": "http.response.body", "body": body, "more_body": True})


async def end_sse(send) -> None:
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
