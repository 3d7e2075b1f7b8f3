"""The ASGI app: routes, validation into a `Submit`, replies out as JSON or SSE. JSON stops here.

Design notes. Each POST runs in a nursery beside a task awaiting `http.disconnect`; a disconnect
cancels the handler's scope, and its `finally` cancels the request in the engine (the running
worker's scope at once through RequestControl; a waiting request leaves the queue through a
`Cancel` to admission). The admission stays held until the worker acknowledges. A response is
marked complete before its final send, so a client that closes right after the last chunk does
not turn a finished request into a cancelled one.
"""

from __future__ import annotations

import itertools
import secrets
import time

import trio

from cairn.actors.messages import (Cancel, CancelAck, Done, Failed, Progress, Rejected, RequestControl, Sampling,
                                   Started, Submit, TokenOut)
from cairn.actors.trace import RequestTrace
from cairn.actors.turns import turn_boundaries

from .chat import ChatTemplateError
from .http import read_body, send_error, send_json
from .responders import ChatJSON, ChatStream, CompletionOut
from .schemas import APIError, CommonParams, parse_chat, parse_completion, parse_json_body

REPLY_BUFFER = 64  # tokens may run ahead of a slow client by this much; then decode waits for it


def _leaves(eg: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for e in eg.exceptions:
        out += _leaves(e) if isinstance(e, BaseExceptionGroup) else [e]
    return out


class API:
    def __init__(self, *, inbox: trio.MemorySendChannel, tokenizer, renderer, model_id: str,
                 context_length: int, vocab_size: int, max_tokens_default: int, fingerprint: str,
                 log, api_key: str | None = None, metrics=None, status=None, checkpoints=None) -> None:
        self.inbox = inbox
        self.tok = tokenizer
        self.renderer = renderer
        self.model_id = model_id
        self.ctx = context_length
        self.vocab = vocab_size
        self.max_tokens_default = max_tokens_default
        self.fingerprint = "fp_" + fingerprint[:12]
        self.log = log
        self.api_key = api_key
        self.metrics = metrics
        self.checkpoints = checkpoints   # actors.checkpoints.Checkpoints: GET / DELETE /v1/checkpoints
        self.markers = tokenizer.template_markers()   # message starts in ids: capture candidates (turns.py)
        if status is None:
            from .status import StatusBoard
            status = StatusBoard(fingerprint=fingerprint, context_length=context_length)
        self.status = status       # daemon/status.py: GET /v1/status, fed by _drive
        self.created = int(time.time())
        self._ids = itertools.count(1)
        self._prefix = secrets.token_hex(4)

    # --- ASGI ---------------------------------------------------------------------------------

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            return await self._lifespan(receive, send)
        if scope["type"] != "http":
            return
        try:
            await self._route(scope, receive, send)
        except BaseExceptionGroup as eg:
            # Errors raised inside a handler's nursery arrive wrapped; one error is handled as itself.
            leaves = _leaves(eg)
            if len(leaves) != 1 or isinstance(leaves[0], trio.Cancelled):
                raise
            await self._fail(leaves[0], scope, send)
        except Exception as e:
            await self._fail(e, scope, send)

    async def _fail(self, e: BaseException, scope, send) -> None:
        if isinstance(e, APIError):
            return await send_error(send, e)
        if isinstance(e, ConnectionAbortedError):
            return
        if isinstance(e, (trio.BrokenResourceError, trio.ClosedResourceError)):
            return await send_error(send, APIError(503, "the server is shutting down", code="shutting_down"))
        if not isinstance(e, Exception):
            raise e
        # A bug here must not take the daemon down; say so in the log.
        self.log.error("handler_failed", path=scope.get("path"), exc_info=e)
        try:
            await send_error(send, APIError(500, f"internal error: {type(e).__name__}", code="internal_error"))
        except Exception:
            pass

    async def _lifespan(self, receive, send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _route(self, scope, receive, send) -> None:
        method, path = scope["method"], scope["path"].rstrip("/") or "/"
        if scope.get("server") is not None and self.api_key is not None:
            self._check_auth(scope)
        routes = {
            ("GET", "/health"): self._health,
            ("GET", "/v1/models"): self._models,
            ("GET", "/metrics"): self._metrics,
            ("GET", "/v1/checkpoints"): self._checkpoints,
            ("GET", "/v1/status"): self._status,
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/v1/completions"): self._completions,
        }
        handler = routes.get((method, path))
        if handler is None:
            if path.startswith("/v1/models/") and method == "GET":
                return await self._model(path.removeprefix("/v1/models/"), send)
            if path.startswith("/v1/checkpoints/") and "/" not in path.removeprefix("/v1/checkpoints/"):
                if method != "DELETE":
                    raise APIError(405, f"method {method} not allowed on {path}", code="method_not_allowed")
                return await self._delete_checkpoint(path.removeprefix("/v1/checkpoints/"), send)
            if any(p == path for _, p in routes):
                raise APIError(405, f"method {method} not allowed on {path}", code="method_not_allowed")
            raise APIError(404, f"no route {method} {path}", code="not_found")
        await handler(scope, receive, send)

    def _check_auth(self, scope) -> None:
        headers = dict(scope.get("headers") or [])
        got = headers.get(b"authorization", b"").decode("latin-1")
        if not secrets.compare_digest(got.encode(), f"Bearer {self.api_key}".encode()):
            raise APIError(401, "missing or wrong API key (Authorization: Bearer ...)", code="invalid_api_key")

    # --- simple routes ------------------------------------------------------------------------

    def _model_card(self) -> dict:
        return {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "cairn",
                "max_model_len": self.ctx}

    async def _health(self, scope, receive, send) -> None:
        await send_json(send, 200, {"status": "ok", "model": self.model_id})

    async def _metrics(self, scope, receive, send) -> None:
        from .metrics import CONTENT_TYPE

        body = (self.metrics.render() if self.metrics is not None else "").encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", CONTENT_TYPE.encode()),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def _status(self, scope, receive, send) -> None:
        await send_json(send, 200, self.status.snapshot(self.model_id))

    async def _checkpoints(self, scope, receive, send) -> None:
        rows = self.checkpoints.listing() if self.checkpoints is not None else []
        await send_json(send, 200, {"object": "list", "data": [
            {"id": r.id, "object": "checkpoint", "tokens": r.tokens, "kind": r.kind, "bytes": r.bytes,
             "tier": r.tier, "hits": r.hits, "last_used": r.last_used} for r in rows]})

    async def _delete_checkpoint(self, cid: str, send) -> None:
        if self.checkpoints is None or not await self.checkpoints.delete(cid):
            raise APIError(404, f"checkpoint {cid!r} does not exist", param="id", code="checkpoint_not_found")
        await send_json(send, 200, {"id": cid, "object": "checkpoint", "deleted": True})

    async def _models(self, scope, receive, send) -> None:
        await send_json(send, 200, {"object": "list", "data": [self._model_card()]})

    async def _model(self, name: str, send) -> None:
        self._check_model(name)
        await send_json(send, 200, self._model_card())

    def _check_model(self, name: str) -> None:
        if name != self.model_id:
            raise APIError(404, f"model {name!r} does not exist; this server serves {self.model_id!r}",
                           param="model", code="model_not_found")

    # --- building a Submit --------------------------------------------------------------------

    def _budget(self, n_prompt: int, asked: int | None, prompt_param: str) -> int:
        if n_prompt >= self.ctx:
            raise APIError(400, f"{prompt_param}: the prompt is {n_prompt} tokens; this model's context is "
                           f"{self.ctx} tokens", param=prompt_param, code="context_length_exceeded")
        room = self.ctx - n_prompt
        if asked is None:
            return min(self.max_tokens_default, room)
        if asked > room:
            raise APIError(400, f"max_tokens: {asked} is too large; the prompt is {n_prompt} tokens and the "
                           f"context {self.ctx}, so at most {room}", param="max_tokens",
                           code="context_length_exceeded")
        return asked

    def _new_id(self, kind: str) -> str:
        return f"{kind}-{self._prefix}{next(self._ids):06d}"

    @staticmethod
    def _sampling(c: CommonParams, max_tokens: int, logprobs: bool, top: int) -> Sampling:
        return Sampling(max_tokens=max_tokens, temperature=c.temperature, top_p=c.top_p, top_k=c.top_k,
                        seed=c.seed, stop=c.stop, logprobs=logprobs, top_logprobs=top, ignore_eos=c.ignore_eos)

    # --- endpoints ----------------------------------------------------------------------------

    async def _chat(self, scope, receive, send) -> None:
        received = trio.current_time()
        req = parse_chat(parse_json_body(await read_body(receive)))
        self._check_model(req.common.model)
        try:
            # Rendering and tokenizing a long conversation takes a while: off the event loop.
            ids, hint = await trio.to_thread.run_sync(self._render_chat, req, abandon_on_cancel=True)
        except ChatTemplateError as e:
            param = str(e).split(":", 1)[0] if str(e).startswith(("messages", "tools")) else "messages"
            raise APIError(400, str(e), param=param, code="invalid_value") from None
        budget = self._budget(len(ids), req.common.max_tokens, "messages")
        rid = self._new_id("chatcmpl")
        sampling = self._sampling(req.common, budget, req.logprobs, req.top_logprobs)
        out = ChatStream(self, rid, req) if req.common.stream else ChatJSON(self, rid, req)
        await self._drive(receive, send, rid, ids, hint, sampling, False, out, received)

    def _render_chat(self, req) -> tuple[list[int], int | None]:
        """Chat -> token ids, and the system-prefix boundary as a token count (checkpoint hint)."""
        rendered = self.renderer.render(req.messages, tools=req.tools)
        ids = self.tok.encode(rendered.text)
        hint = None
        if rendered.system_prefix_bytes is not None:
            hint = self.tok.boundary_for_byte_offset(rendered.text, rendered.system_prefix_bytes)
            # Accept the boundary only if the system part, tokenized on its own, gives the prompt's
            # first ids: then every conversation with this system part starts with the same ids.
            prefix = rendered.text.encode()[:rendered.system_prefix_bytes].decode(errors="ignore")
            if not hint or list(self.tok.encode(prefix)[:hint]) != list(ids[:hint]):
                hint = None
        return ids, hint

    async def _completions(self, scope, receive, send) -> None:
        received = trio.current_time()
        req = parse_completion(parse_json_body(await read_body(receive)))
        self._check_model(req.common.model)
        if req.prompt_ids is not None:
            bad_ids = [t for t in req.prompt_ids if not 0 <= t < self.vocab]
            if bad_ids:
                raise APIError(400, f"prompt: token id {bad_ids[0]} is outside the vocabulary (0..{self.vocab - 1})",
                               param="prompt", code="invalid_value")
            ids = req.prompt_ids
        else:
            ids = await trio.to_thread.run_sync(self.tok.encode, req.prompt_text, abandon_on_cancel=True)
        if not ids:
            raise APIError(400, "prompt: empty; at least one token is needed", param="prompt", code="invalid_value")
        budget = self._budget(len(ids), req.common.max_tokens, "prompt")
        rid = self._new_id("cmpl")
        want_lp = req.logprobs is not None
        sampling = self._sampling(req.common, budget, want_lp, req.logprobs or 0)
        out = CompletionOut(self, rid, req, ids)
        await self._drive(receive, send, rid, ids, None, sampling, want_lp and req.echo, out, received)

    # --- the request's life -------------------------------------------------------------------

    async def _drive(self, receive, send, rid, ids, hint, sampling, prompt_logprobs, out,
                     received: float | None = None) -> None:
        reply_send, reply_recv = trio.open_memory_channel(REPLY_BUFFER)
        control = RequestControl()
        # Capture candidates from the template's markers, for every endpoint (chat, ids, text): the
        # same conversation captures at the same positions however it is sent. `ids` are Python ints
        # already (validated JSON ints or the tokenizer's), so tuple() needs no per-id int().
        turns = turn_boundaries(ids, self.markers)
        submit = Submit(rid, tuple(ids), turns.system_end if hint is None else hint, sampling,
                        prompt_logprobs, reply_send, control, turn_tokens=turns.last_user,
                        trace=RequestTrace(received))
        terminal = None
        self.status.submitted(rid, len(ids), sampling.max_tokens)
        try:
            async with reply_recv:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_watch_disconnect, receive, nursery.cancel_scope)
                    submit.trace.submitted_at = trio.current_time()
                    await self.inbox.send(submit)
                    async for msg in reply_recv:
                        self.status.seen(rid, msg)
                        if isinstance(msg, Progress):
                            await out.progress(send, msg)
                        elif isinstance(msg, TokenOut):
                            await out.token(send, msg)
                        elif isinstance(msg, Started):
                            await out.start(send, msg)
                        else:
                            terminal = msg
                            break
                    nursery.cancel_scope.cancel()
            # Complete before the final send: the watcher is gone, so a disconnect racing the last
            # bytes (or the server's own close) cannot cancel this send half-way.
            if isinstance(terminal, Done):
                await out.done(send, terminal)
            elif isinstance(terminal, Rejected):
                await send_error(send, APIError(
                    429, "the engine is busy and its queue is full; retry later", code="queue_full",
                    headers={"Retry-After": str(terminal.retry_after_s)}))
            elif isinstance(terminal, Failed):
                await out.failed(send, APIError(500, terminal.message, code="engine_error"))
            elif isinstance(terminal, CancelAck):
                await out.failed(send, APIError(503, "request cancelled (server shutting down)", code="cancelled"))
        finally:
            self.status.finished(rid)
            if terminal is None:
                control.cancel()
                with trio.CancelScope(shield=True), trio.move_on_after(2):
                    try:
                        await self.inbox.send(Cancel(rid))
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        pass  # the engine is gone (shutdown): nothing left to cancel


async def _watch_disconnect(receive, scope: trio.CancelScope) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            scope.cancel()
            return
