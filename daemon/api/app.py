"""The ASGI app: routes, validation into a `Submit`, replies out as JSON or SSE. JSON stops here.

Design notes. Each POST runs in a nursery beside a task awaiting `http.disconnect`; a disconnect
cancels the handler's scope, and its `finally` cancels the request in the engine (the running
worker's scope at once through RequestControl; a waiting request leaves the queue through a
`Cancel` to admission). The admission stays held until the worker acknowledges. A response is
marked complete before its final send, so a client that closes right after the last chunk does
not turn a finished request into a cancelled one.
"""

from __future__ import annotations

import bisect
import itertools
import secrets
import time

import trio

from cairn.actors.engine.errors import single
from cairn.actors.engine.messages import (Cancel, CancelAck, Done, Failed, Progress, Rejected, RequestControl, Sampling,
                                   Started, Submit, TokenOut)
from cairn.actors.engine.replies import STALL_S
from cairn.actors.engine import spans as decode_spans
from cairn.actors.engine.trace import RequestTrace

from . import anthropic, worker_info
from .access import api_key_matches, loopback_host, operator_endpoint, x_api_key_matches
from .anthropic_reply import MessagesJSON, MessagesStream, send_anthropic_error
from .cache_diagnostics import FingerprintTable, fingerprint, outcome, prepare
from cairn.daemon.protocol.agent_protocol import AgentProtocol
from cairn.daemon.protocol.chat import ChatTemplateError, continues_final
from cairn.daemon.protocol.families import chat_family
from cairn.daemon.protocol.reply_end import reply_end
from cairn.daemon.protocol.reply_ids import keepable, parsed_key, replay, reply_marks
from .asgi import BodyBytes, Coalesced, declared_length, read_body, send_error, send_json, too_large
from .responders import ChatJSON, ChatStream, CompletionOut
from .responses import as_responses_error, parse_responses
from .responses_reply import ResponsesJSON, ResponsesStream
from .schemas import APIError, CommonParams, parse_chat, parse_completion, parse_json_body

REPLY_BUFFER = 64  # tokens may run ahead of a slow client by this much; then decode waits for it
PARSE_ON_LOOP = 1 << 20   # bodies up to 1 MiB are parsed on the event loop (milliseconds); larger in a thread
LARGE_BODIES = 2          # larger bodies are read and parsed this many at a time


class API:
    def __init__(self, *, inbox: trio.MemorySendChannel, tokenizer, renderer, model_id: str,
                 context_length: int, vocab_size: int, max_tokens_default: int | None, fingerprint: str,
                 log, api_key: str | None = None, metrics=None, status=None, checkpoints=None,
                 reasoning: str = "chat", replies=None, fingerprints=None, body_bytes: int | None = None,
                 chat=None) -> None:
        self.inbox = inbox
        self.tok = tokenizer
        self.chat = chat if chat is not None else chat_family()   # the model family's chat half (V4's by default)
        self.renderer = renderer
        self.model_id = model_id
        self.ctx = context_length
        self.vocab = vocab_size
        self.max_tokens_default = max_tokens_default   # None: the rest of the context
        self.fingerprint = "fp_" + fingerprint[:12]
        self.log = log
        self.api_key = api_key
        self.metrics = metrics
        self.checkpoints = checkpoints   # actors.checkpoints.actor.Checkpoints: GET / DELETE /v1/checkpoints
        self.markers = tokenizer.template_markers()   # message starts in ids: capture candidates (turns.py)
        # replies reused exactly (daemon/protocol/reply_ids.py): the table, and the ids it reads; off
        # without a table or with a template other than V4's own encoding
        self.replies = replies
        self.reply_marks = reply_marks(tokenizer, renderer) if replies is not None else None
        # finished responses' prompts, compared with later ones (cache_diagnostics.py)
        if fingerprints is None:
            from cairn.daemon.service.memory_plan import DIAGNOSTIC_IDS_BYTES
            fingerprints = FingerprintTable(DIAGNOSTIC_IDS_BYTES)
        self.fingerprints = fingerprints
        self.spans = decode_spans.enabled()    # per-token spans in the request log line (bench only)
        if status is None:
            from .status import StatusBoard
            status = StatusBoard(fingerprint=fingerprint, context_length=context_length, fingerprints=fingerprints)
        self.status = status       # daemon/api/status.py: GET /v1/status, fed by _drive
        self.reasoning = reasoning   # the server's default mode (--reasoning)
        self.agent = AgentProtocol(tokenizer, vocab_size, log, chat=self.chat)
        self.created = int(time.time())
        self._ids = itertools.count(1)
        self._prefix = secrets.token_hex(4)
        # CPU work of the edge (parsing a large body, rendering and tokenizing) runs in threads that
        # are never abandoned — a cancelled request waits for its own — and one at a time, so the
        # edge never takes more than one core from the kernel.
        self._cpu = trio.CapacityLimiter(1)
        # Bodies over PARSE_ON_LOOP (or of unknown length) are read and parsed LARGE_BODIES at a time:
        # a burst of 64 MiB bodies cannot hold gigabytes at once.
        self._large_bodies = trio.Semaphore(LARGE_BODIES)
        # ...and every body, small ones too, holds its bytes of the memory plan's room for bodies being
        # read and parsed (memory_plan.body_bytes) until it is parsed.
        if body_bytes is None:
            from cairn.daemon.service.memory_plan import BODY_MAX as body_bytes
        self.bodies = BodyBytes(body_bytes)
        # A prompt of more UTF-8 bytes than this cannot fit the context (tokenizer.max_token_bytes):
        # refused by its size, before tokenizing (a 50 MB prompt would take most of a minute).
        mtb = getattr(tokenizer, "max_token_bytes", None)
        self.max_prompt_bytes = None if not mtb else context_length * mtb

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
            one = single(eg)
            if one is eg or isinstance(one, trio.Cancelled):
                raise
            await self._fail(one, scope, send)
        except Exception as e:
            await self._fail(e, scope, send)

    async def _fail(self, e: BaseException, scope, send) -> None:
        # the Anthropic routes answer errors in Anthropic's shape, auth and routing errors included
        reply = send_anthropic_error if anthropic.is_messages_path(scope.get("path", "")) else send_error
        if isinstance(e, APIError):
            self._log_rejected(e, path=scope.get("path"))
            return await reply(send, e)
        if isinstance(e, ConnectionAbortedError):
            return
        if isinstance(e, (trio.BrokenResourceError, trio.ClosedResourceError)):
            return await reply(send, APIError(503, "the server is shutting down", code="shutting_down"))
        if not isinstance(e, Exception):
            raise e
        # A bug here must not take the daemon down; say so in the log.
        self.log.error("handler_failed", path=scope.get("path"), exc_info=e)
        try:
            # generic on purpose: an exception's text may carry internals (paths, library panics)
            await reply(send, APIError(500, "internal error; the details are in the server log",
                                       code="internal_error"))
        except Exception:
            pass

    def _log_rejected(self, e: APIError, **where) -> None:
        """One info line per refused request, with the reason as the client got it (never the body)."""
        if 400 <= e.status < 500:
            self.log.info("request_rejected", status=e.status, code=e.code, param=e.param, message=e.message,
                          **where)

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
        if scope.get("server") is not None:      # TCP (hypercorn gives no server address for a Unix socket)
            self._check_tcp_access(scope)
        elif self.api_key is not None and operator_endpoint(path):
            self._check_key(scope)               # the socket's clients may chat, not manage the daemon
        routes = {
            ("GET", "/health"): self._health,
            ("GET", "/v1/models"): self._models,
            ("GET", "/metrics"): self._metrics,
            ("GET", "/v1/checkpoints"): self._checkpoints,
            ("GET", "/v1/status"): self._status,
            ("GET", "/server_info"): self._server_info,     # for a gateway: daemon/api/worker_info.py
            ("GET", "/model_info"): self._model_info,
            ("GET", "/v1/loads"): self._loads,
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/v1/completions"): self._completions,
            ("POST", "/v1/messages"): self._messages,                  # Anthropic: daemon/api/anthropic.py
            ("POST", "/v1/messages/count_tokens"): self._count_tokens,
            ("POST", "/v1/responses"): self._responses,
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

    def _check_key(self, scope) -> None:
        headers = dict(scope.get("headers") or [])
        # x-api-key: how Anthropic's clients send a key (Claude Code's ANTHROPIC_API_KEY)
        if not (api_key_matches(headers.get(b"authorization", b""), self.api_key)
                or x_api_key_matches(headers.get(b"x-api-key"), self.api_key)):
            raise APIError(401, "missing or wrong API key (Authorization: Bearer ... or x-api-key: ...)", code="invalid_api_key")

    def _check_tcp_access(self, scope) -> None:
        headers = dict(scope.get("headers") or [])
        if self.api_key is not None:
            if scope["path"].rstrip("/") != "/health":   # liveness stays open: a gateway probes it without the key
                self._check_key(scope)
        elif b"host" in headers and not loopback_host(headers[b"host"]):
            host = headers[b"host"].decode("latin-1")
            raise APIError(403, f"Host {host!r} is not allowed: without an API key the TCP listener only answers "
                           "requests addressed to localhost, 127.0.0.1 or [::1] (DNS rebinding protection); "
                           "use one of those names, or set api_key", code="host_not_allowed",
                           type="permission_error")

    # --- simple routes ------------------------------------------------------------------------

    def _model_card(self) -> dict:
        """OpenAI's model object, vLLM's `max_model_len`, and Anthropic's (`type`, `display_name`,
        `created_at`, and the context limits its capability fields name), so one list serves both
        kinds of client (docs/api.md, "GET /v1/models")."""
        created_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.created))
        return {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "cairn",
                "max_model_len": self.ctx, "type": "model", "display_name": self.model_id,
                "created_at": created_at, "max_input_tokens": self.ctx - 1, "max_tokens": self.ctx - 1}

    async def _health(self, scope, receive, send) -> None:
        await send_json(send, 200, {"status": "ok", "model": self.model_id})

    async def _metrics(self, scope, receive, send) -> None:
        from cairn.daemon.service.metrics import CONTENT_TYPE

        body = (self.metrics.render() if self.metrics is not None else "").encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", CONTENT_TYPE.encode()),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def _status(self, scope, receive, send) -> None:
        await send_json(send, 200, self.status.snapshot(self.model_id))

    def _max_running(self) -> int:
        """One running request per sequence slot (`Engine.slots` is the list of them)."""
        return max(1, len(getattr(self.status.engine, "slots", None) or ()))

    async def _server_info(self, scope, receive, send) -> None:
        from .status import version

        await send_json(send, 200, worker_info.server_info(
            model_id=self.model_id, context_length=self.ctx, fingerprint=self.fingerprint, version=version(),
            max_running_requests=self._max_running(), queue_size=self.status.queue_size))

    async def _model_info(self, scope, receive, send) -> None:
        await send_json(send, 200, worker_info.model_info(model_id=self.model_id))

    async def _loads(self, scope, receive, send) -> None:
        from .status import version

        await send_json(send, 200, worker_info.loads(**self.status.load(), context_length=self.ctx,
                                                     max_running_requests=self._max_running(), version=version()))

    async def _checkpoints(self, scope, receive, send) -> None:
        rows = self.checkpoints.listing() if self.checkpoints is not None else []
        await send_json(send, 200, {"object": "list", "data": [
            {"id": r.id, "object": "checkpoint", "tokens": r.tokens, "kind": r.kind, "bytes": r.bytes,
             "own_bytes": r.own_bytes, "shared_bytes": r.shared_bytes,
             "tier": r.tier, "hits": r.hits, "last_used": r.last_used} for r in rows]})

    async def _delete_checkpoint(self, cid: str, send) -> None:
        if self.checkpoints is None or not await self.checkpoints.delete(cid):
            raise APIError(404, f"checkpoint {cid!r} does not exist", param="id", code="checkpoint_not_found")
        await send_json(send, 200, {"id": cid, "object": "checkpoint", "deleted": True})

    async def _models(self, scope, receive, send) -> None:
        # Anthropic's list adds first_id / last_id / has_more (Claude Code's gateway discovery reads it)
        await send_json(send, 200, {"object": "list", "data": [self._model_card()], "first_id": self.model_id,
                                    "last_id": self.model_id, "has_more": False})

    async def _model(self, name: str, send) -> None:
        self._check_model(name)
        await send_json(send, 200, self._model_card())

    def _check_model(self, name: str) -> None:
        if name != self.model_id:
            raise APIError(404, f"model {name!r} does not exist; this server serves {self.model_id!r}",
                           param="model", code="model_not_found")

    # --- building a Submit --------------------------------------------------------------------

    def _budget(self, n_prompt: int, asked: int | None, prompt_param: str, asked_param: str = "max_tokens") -> int:
        if n_prompt >= self.ctx:
            raise APIError(400, f"{prompt_param}: the prompt is {n_prompt} tokens; this model's context is "
                           f"{self.ctx} tokens", param=prompt_param, code="context_length_exceeded")
        room = self.ctx - n_prompt
        if asked is None:
            return room if self.max_tokens_default is None else min(self.max_tokens_default, room)
        if asked > room:
            raise APIError(400, f"{asked_param}: {asked} is too large; the prompt is {n_prompt} tokens and the "
                           f"context {self.ctx}, so at most {room}", param=asked_param,
                           code="context_length_exceeded")
        return asked

    def _new_id(self, kind: str) -> str:
        return f"{kind}-{self._prefix}{next(self._ids):06d}"

    def _sampling(self, c: CommonParams, max_tokens: int, logprobs: bool, top: int,
                  constraint=None, banned: tuple[int, ...] = ()) -> Sampling:
        self.agent.check_logit_bias(c)
        return Sampling(max_tokens=max_tokens, temperature=c.temperature, top_p=c.top_p, top_k=c.top_k,
                        seed=c.seed, stop=c.stop, logprobs=logprobs, top_logprobs=top, ignore_eos=c.ignore_eos,
                        presence_penalty=c.presence_penalty, frequency_penalty=c.frequency_penalty,
                        logit_bias=c.logit_bias, banned=banned, constraint=constraint)

    # --- endpoints ----------------------------------------------------------------------------

    async def _parse(self, scope, receive, parse):
        """Read the body (413 before reading when it is too large) and parse it, in a thread when large;
        its bytes held in `bodies` meanwhile (a body of unknown length holds the most it may be)."""
        n = declared_length(scope)
        limit = self.bodies.limit()
        if n is not None and n > limit:
            raise too_large(limit, n)
        if n is not None and n <= PARSE_ON_LOOP:
            async with self.bodies.hold(n):
                raw = await read_body(receive, limit, scope=scope)
                if len(raw) <= PARSE_ON_LOOP:
                    return parse(parse_json_body(raw))
                return await trio.to_thread.run_sync(lambda: parse(parse_json_body(raw)), limiter=self._cpu)
        async with self._large_bodies:
            async with self.bodies.hold(limit if n is None else n):
                raw = await read_body(receive, limit, scope=scope)
                if len(raw) <= PARSE_ON_LOOP:
                    return parse(parse_json_body(raw))
                return await trio.to_thread.run_sync(lambda: parse(parse_json_body(raw)), limiter=self._cpu)

    def _check_prompt_size(self, n_bytes: int, param: str) -> None:
        if self.max_prompt_bytes is not None and n_bytes > self.max_prompt_bytes:
            raise APIError(400, f"{param}: the prompt is {n_bytes} bytes; this model's context of {self.ctx} tokens "
                           f"holds at most {self.max_prompt_bytes} bytes (a token is at most "
                           f"{self.max_prompt_bytes // self.ctx} bytes), so it cannot fit", param=param,
                           code="context_length_exceeded")

    async def _chat(self, scope, receive, send) -> None:
        received = trio.current_time()
        req = await self._parse(scope, receive, parse_chat)
        options, ids, hint, turn_end, constraint = await self._chat_prompt(
            req, param=lambda m: m.split(":", 1)[0] if m.startswith(("messages", "tools")) else "messages")
        budget = self._budget(len(ids), req.common.max_tokens, "messages")
        rid = self._new_id("chatcmpl")
        sampling = self._sampling(req.common, budget, req.logprobs, req.top_logprobs, constraint,
                                  banned=self._no_tool_calls(req))
        # a continued assistant message is past its reasoning: the reply goes on with its content
        thinking = options.thinking and not continues_final(req.messages)
        out = (ChatStream if req.common.stream else ChatJSON)(self, rid, req, thinking=thinking)
        prep = await self._diagnose(req, options, ids, turn_end)
        await self._drive(receive, send, rid, ids, hint, sampling, False, out, received, turn_end, chat=True,
                          prep=prep)

    async def _responses(self, scope, receive, send) -> None:
        """The Responses API: translated into the chat request (responses.py), then the chat path's
        rendering and engine; only the reply is its own (responses_reply.py)."""
        received = trio.current_time()
        rr = await self._parse(scope, receive, parse_responses)
        req = rr.chat
        try:
            options, ids, hint, turn_end, constraint = await self._chat_prompt(
                req, ignored=tuple(f"tools[].type={t}" for t in rr.dropped_tools),
                param=lambda m: "tools" if m.startswith("tools") else "input", prompt_param="input")
        except APIError as e:    # a grammar that does not compile names response_format: say text.format
            raise as_responses_error(e) from None
        budget = self._budget(len(ids), req.common.max_tokens, "input", "max_output_tokens")
        rid = self._new_id("resp")
        sampling = self._sampling(req.common, budget, False, 0, constraint, banned=self._no_tool_calls(req))
        prep = await self._diagnose(req, options, ids, turn_end)
        out = (ResponsesStream if req.common.stream else ResponsesJSON)(self, rid, rr, thinking=options.thinking,
                                                                        diagnostics=prep and prep.vendor)
        await self._drive(receive, send, rid, ids, hint, sampling, False, out, received, turn_end, chat=True,
                          prep=prep)

    def _no_tool_calls(self, req) -> tuple[int, ...]:
        """tool_choice "none" with tools offered: the token that opens the family's call block is banned."""
        if not req.tools or req.callable_tools is not None:
            return ()
        opener = self.tok.token_to_id(self.chat.call_opener)
        return () if opener is None else (opener,)

    def _render_chat(self, req, options=None, prompt_param: str = "messages"):
        """Chat -> token ids, the system-prefix boundary as a token count (checkpoint hint), where the
        next turn will diverge (a token count, or None), and the grammar constraint (or None)."""
        rendered = self.renderer.render(req.messages, tools=req.tools, options=options)
        data = rendered.text.encode()
        self._check_prompt_size(len(data), prompt_param)
        # The one tokenization of the whole prompt: ids and where each token ends (for the boundaries).
        # The request's text is tokenized as text: control tokens come from the renderer's structure only.
        content = rendered.content_spans
        ids, ends = self.tok.encode_with_offsets(rendered.text, content) if content else \
            self.tok.encode_with_offsets(rendered.text)
        hint = self._boundary(data, rendered.system_prefix_bytes, ids, ends, content)
        turn_end = None
        if rendered.resume_bytes is not None:
            # Before a final special token (V4's `<think>`) the split is exact: the tokenizer cuts the
            # text at special tokens first, so no second tokenization of the whole prompt is needed.
            tail = data[rendered.resume_bytes:].decode()
            if ids and self.tok.token_to_id(tail) == ids[-1]:
                turn_end = len(ids) - 1
            else:
                turn_end = self._boundary(data, rendered.resume_bytes, ids, ends, content)
        ids, hint, turn_end = self._replay(req, data, ids, ends, hint, turn_end)
        # a prompt that cannot fit is refused by the caller: no grammar is compiled for it
        constraint = self.agent.constraint(req, options) if len(ids) < self.ctx else None
        return ids, hint, turn_end, constraint

    def _replay(self, req, data: bytes, ids, ends, hint, turn_end):
        """Past replies still in the reply table rendered with the ids the model generated for them
        (reply_ids.py); the boundaries moved with them."""
        if self.reply_marks is None:
            return ids, hint, turn_end
        r = replay(ids, ends, data, req.messages, self.replies, self.reply_marks)
        if r is None:
            return ids, hint, turn_end
        self.log.debug("reply_ids_replayed", turns=len(r.spans), tokens=r.tokens, prompt_tokens=len(r.ids),
                       text_tokens=len(ids))
        return r.ids, r.position(hint), r.position(turn_end)

    def _reply_opener(self, ids, turn_end) -> int | None:
        """The id the reply will follow when its ids are worth keeping: a prompt that ends with
        `<｜Assistant｜>` and the mode marker, whose next turn renders this reply after that marker
        (not V4's thinking mode without tools, which drops the reasoning: `turn_end` is set then)."""
        m = self.reply_marks
        if m is None or turn_end is not None or len(ids) < 2 or ids[-2] != m.assistant:
            return None
        return ids[-1] if ids[-1] in (m.think, m.end_think) else None

    def _keep_reply(self, rid: str, out, done: Done, opener: int) -> bool:
        """A reply that ended by itself (EOS; nothing cut, dropped or malformed): its generated ids,
        keyed by what the API returned (the output parser's result every API serializes). Whether kept."""
        parser = getattr(out, "parser", None)
        if parser is None or not done.ids:
            return False
        parsed = parser.result
        if not keepable(parsed, reply_end(done.finish_reason, done.stop_sequence, parsed), done.ids,
                        self.reply_marks.eos):
            return False
        # the key is what the client got, so what it sends back: no reasoning when it was omitted
        if self.replies.put(parsed_key(parsed, omit_reasoning=getattr(out, "omits_reasoning", False)), opener,
                            done.ids):
            self.log.debug("reply_ids_kept", request_id=rid, tokens=len(done.ids))
            return True
        return False

    async def _diagnose(self, req, options, ids, turn_end):
        """The prompt's fingerprint, the comparison the request asks for and the earlier turn it extends
        (cache_diagnostics.py), in a worker thread (hashing a long conversation, comparing ids). Never
        fails the request: a bug here is logged and the request runs without diagnostics."""
        def work():
            fp = fingerprint(f"{self.model_id}:{self.fingerprint}", req.messages, req.tools, ids,
                             thinking=options.thinking, effort=options.effort,
                             response_schema=options.response_schema, turn_end=turn_end)
            return prepare(self.fingerprints, fp, req.diagnostics)
        try:
            return await trio.to_thread.run_sync(work, limiter=self._cpu)
        except Exception as e:
            self.log.warning("cache_diagnostics_failed", exc_info=e)
            return None

    def _cache_started(self, rid: str, prep, reused: int, reuse: dict | None) -> None:
        """The request's reuse is known: its figures against the earlier response it was compared with
        (or the earlier turn it extends) go to /v1/status and, on a miss or a shortfall, to the log."""
        ev, miss, shortfall = outcome(prep, reused, reuse)
        asked = prep.ask is not None and prep.ask.compare_to is not None
        self.fingerprints.note({"request_id": rid, **ev}, asked=asked, miss=miss, shortfall=shortfall)
        if miss or shortfall:
            self.log.info("cache_diagnostics", request_id=rid, miss=miss, shortfall=shortfall, **ev)
        elif asked:
            self.log.debug("cache_diagnostics", request_id=rid, miss=False, shortfall=False, **ev)

    def _boundary(self, data: bytes, byte_offset: int | None, ids: list[int], ends: list[int],
                  content: tuple[tuple[int, int], ...] = ()) -> int | None:
        """A byte offset of the prompt (`data`, its UTF-8) as a token count, if the text before it
        tokenizes on its own to the prompt's first ids (then every prompt sharing that text starts with
        the same ids). Only that prefix is tokenized again (its content spans as in the whole)."""
        if byte_offset is None:
            return None
        n = bisect.bisect_right(ends, byte_offset)       # the tokens that end at or before it
        prefix = data[:byte_offset].decode(errors="ignore")
        inside = tuple((a, min(b, len(prefix))) for a, b in content if a < len(prefix))
        prefix_ids = self.tok.encode(prefix, inside) if inside else self.tok.encode(prefix)
        if not n or list(prefix_ids[:n]) != list(ids[:n]):
            return None
        return n

    async def _completions(self, scope, receive, send) -> None:
        received = trio.current_time()
        req = await self._parse(scope, receive, lambda d: parse_completion(d, context_length=self.ctx))
        self._check_model(req.common.model)
        self.agent.note_ignored(req.common.ignored)
        if req.prompt_ids is not None:
            bad_ids = [t for t in req.prompt_ids if not 0 <= t < self.vocab]
            if bad_ids:
                raise APIError(400, f"prompt: token id {bad_ids[0]} is outside the vocabulary (0..{self.vocab - 1})",
                               param="prompt", code="invalid_value")
            ids = req.prompt_ids
        else:
            self._check_prompt_size(len(req.prompt_text.encode()), "prompt")
            ids = await trio.to_thread.run_sync(self.tok.encode, req.prompt_text, limiter=self._cpu)
        if not ids:
            raise APIError(400, "prompt: empty; at least one token is needed", param="prompt", code="invalid_value")
        budget = self._budget(len(ids), req.common.max_tokens, "prompt")
        rid = self._new_id("cmpl")
        want_lp = req.logprobs is not None
        sampling = self._sampling(req.common, budget, want_lp, req.logprobs or 0)
        out = CompletionOut(self, rid, req, ids)
        await self._drive(receive, send, rid, ids, None, sampling, want_lp and req.echo, out, received)

    async def _messages(self, scope, receive, send) -> None:
        """POST /v1/messages: Anthropic's shape translated into a chat request (anthropic.py), the
        chat pipeline, and Anthropic's shape back (anthropic_reply.py)."""
        received = trio.current_time()
        req = await self._parse(scope, receive, anthropic.parse_messages)
        options, ids, hint, turn_end, constraint = await self._chat_prompt(req)
        anthropic.check_context(len(ids), req.common.max_tokens, self.ctx)
        rid = self._new_id("msg").replace("-", "_", 1)
        sampling = self._sampling(req.common, req.common.max_tokens, False, 0, constraint,
                                  banned=self._no_tool_calls(req))
        prep = await self._diagnose(req, options, ids, turn_end)
        out = (MessagesStream if req.common.stream else MessagesJSON)(self, rid, req, len(ids),
                                                                      thinking=options.thinking,
                                                                      diagnostics=prep and prep.vendor)
        await self._drive(receive, send, rid, ids, hint, sampling, False, out, received, turn_end, chat=True,
                          prep=prep)

    async def _count_tokens(self, scope, receive, send) -> None:
        """POST /v1/messages/count_tokens: the prompt /v1/messages would run, counted."""
        req = await self._parse(scope, receive, anthropic.parse_count_tokens)
        _, ids, *_ = await self._chat_prompt(req)
        await send_json(send, 200, {"input_tokens": len(ids)})

    async def _chat_prompt(self, req, *, ignored: tuple[str, ...] = (), param=lambda m: "messages",
                           prompt_param: str = "messages"):
        """The step every chat-shaped API shares: the model, the options, the prompt rendered and
        tokenized; a template error is a 400 naming `param(message)`. Rendering and tokenizing a
        long conversation takes a while, and so may compiling a grammar: off the event loop, and
        not abandoned on a cancel (the thread would go on burning a core for a request that is
        gone); its time is bounded by the body limit."""
        self._check_model(req.common.model)
        self.agent.note_ignored(req.common.ignored + ignored)
        if req.dropped_nonces:      # daemon/protocol/nonces.py: left out of the prompt, said at debug
            self.log.debug("request_nonce_dropped", where=list(req.dropped_nonces))
        options = self.agent.options(req, self.reasoning)
        try:
            ids, hint, turn_end, constraint = await trio.to_thread.run_sync(
                self._render_chat, req, options, prompt_param, limiter=self._cpu)
        except ChatTemplateError as e:
            raise APIError(400, str(e), param=param(str(e)), code="invalid_value") from None
        return options, ids, hint, turn_end, constraint

    # --- the request's life -------------------------------------------------------------------

    async def _drive(self, receive, send, rid, ids, hint, sampling, prompt_logprobs, out,
                     received: float | None = None, turn_end: int | None = None, *, chat: bool = False,
                     prep=None) -> None:
        # prep: the prompt's cache diagnostics (_diagnose), or None
        reply_send, reply_recv = trio.open_memory_channel(REPLY_BUFFER)
        control = RequestControl()
        # Capture candidates from the template's markers, for every endpoint (chat, ids, text): the
        # same conversation captures at the same positions however it is sent. `ids` are Python ints
        # already (validated JSON ints or the tokenizer's), so tuple() needs no per-id int().
        turns = self.chat.turn_boundaries(ids, self.markers)
        # a chat reply whose ids the next turn can replay: Done carries them, the reply's end is captured
        opener = self._reply_opener(ids, turn_end) if chat else None
        submit = Submit(rid, tuple(ids), turns.system_end if hint is None else hint, sampling,
                        prompt_logprobs, reply_send, control, turn_end_tokens=turn_end,
                        turn_tokens=turns.last_user, keep_reply=opener is not None,
                        trace=RequestTrace(received, decode_spans.Spans() if self.spans else None))
        terminal = None
        self.status.submitted(rid, len(ids), sampling.max_tokens, control)
        try:
            async with reply_recv:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_watch_disconnect, receive, nursery.cancel_scope)
                    submit.trace.submitted_at = trio.current_time()
                    await self.inbox.send(submit)
                    held = None             # a message taken while gathering tokens, handled next
                    while True:
                        if held is not None:
                            msg, held = held, None
                        else:
                            try:
                                msg = await reply_recv.receive()
                            except trio.EndOfChannel:
                                msg = None
                        if msg is None:
                            # The engine closed the channel (replies.finish): its terminal reply found the
                            # buffer full (a stalled client), so it waits on the control.
                            terminal = control.final or Failed("internal error: the engine ended the request "
                                                               "without a final reply")
                            break
                        self.status.seen(rid, msg)
                        if isinstance(msg, Progress):
                            await out.progress(send, msg)
                        elif isinstance(msg, TokenOut):
                            t0 = decode_spans.now_ns() if self.spans else 0
                            held = await self._tokens(rid, out, send, msg, reply_recv)
                            if self.spans:
                                submit.trace.spans.add("http", decode_spans.now_ns() - t0)
                        elif isinstance(msg, Started):
                            if prep is not None:
                                self._cache_started(rid, prep, msg.reused_tokens, submit.trace.reuse)
                            await out.start(send, msg)
                        else:
                            terminal = msg
                            break
                    nursery.cancel_scope.cancel()
            # Complete before the final send: the watcher is gone, so a disconnect racing the last
            # bytes (or the server's own close) cannot cancel this send half-way.
            if isinstance(terminal, Done):
                await out.done(send, terminal)
                kept = opener is not None and self._keep_reply(rid, out, terminal, opener)
                if prep is not None:     # a finished response: later prompts may be compared with it
                    self.fingerprints.put(rid, prep.fp.finished(terminal.ids if kept else None))
            elif isinstance(terminal, Rejected):
                err = APIError(429, "the engine is busy and its queue is full; retry later", code="queue_full",
                               headers={"Retry-After": str(terminal.retry_after_s)})
                self._log_rejected(err, request_id=rid)
                await out.failed(send, err)
            elif isinstance(terminal, Failed) and terminal.kind == "memory":
                # the memory plan had no room for this conversation's state (actors/engine/memory_guard.py)
                await out.failed(send, APIError(507, terminal.message, code="insufficient_memory",
                                                type="insufficient_memory"))
            elif isinstance(terminal, Failed):
                await out.failed(send, APIError(500, terminal.message, code="engine_error"))
            elif isinstance(terminal, CancelAck):
                await out.failed(send, _cancelled_error(terminal))
        finally:
            self.status.finished(rid)
            if terminal is None:
                control.cancel()
                with trio.CancelScope(shield=True), trio.move_on_after(2):
                    try:
                        await self.inbox.send(Cancel(rid))
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        pass  # the engine is gone (shutdown): nothing left to cancel


    async def _tokens(self, rid, out, send, first: TokenOut, reply_recv):
        """`first` and every token already waiting behind it, written in one send (asgi.Coalesced):
        tokens queue up only when the kernel runs ahead of this handler, and then one write instead of
        one a token is what lets it catch up. Returns the first other message taken (None: none)."""
        batch = Coalesced(send)
        await out.token(batch, first)
        held = None
        while True:
            try:
                msg = reply_recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            if not isinstance(msg, TokenOut):
                held = msg
                break
            self.status.seen(rid, msg)
            await out.token(batch, msg)
        await batch.flush()
        return held


def _cancelled_error(ack: CancelAck) -> APIError:
    if ack.reason == "stalled":
        return APIError(408, f"request cancelled: the client read nothing for {STALL_S:.0f} s, so the engine "
                        "moved on", code="client_stalled")
    if ack.reason == "shutdown":
        return APIError(503, "request cancelled (server shutting down)", code="cancelled")
    return APIError(503, "request cancelled", code="cancelled")


async def _watch_disconnect(receive, scope: trio.CancelScope) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            scope.cancel()
            return
