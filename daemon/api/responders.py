"""Responders: engine replies -> the HTTP response, one class per endpoint and mode.

Each gets `start` (prefill done), `token`, then exactly one of `done` / `failed`. The API object gives
them the tokenizer, the model id and the fingerprint; JSON shapes come from formats.py.
"""

from __future__ import annotations

import json
import time

from cairn.actors.engine.messages import Done, Progress, Started, TokenOut

from . import formats
from .asgi import end_sse, send_comment, send_error, send_event, send_json, start_sse
from .schemas import APIError
from cairn.daemon.protocol.reply_end import ReplyEnd, end_reply
from cairn.daemon.protocol.output_parser import OutputParserBase   # every family's parser is one
from cairn.daemon.protocol.events import Event
from cairn.daemon.protocol.families import chat_family


class Responder:
    def __init__(self, api, rid: str) -> None:
        self.api, self.rid = api, rid
        self.started_http = False

    async def progress(self, send, p: Progress) -> None:
        """Prefill progress: nothing for a JSON response (see StreamProgress)."""

    async def failed(self, send, err: APIError) -> None:
        if not self.started_http:
            await send_error(send, err)
        else:
            await send_event(send, err.body())
            await end_sse(send)


class StreamProgress(Responder):
    """Streamed responses: prefill progress as SSE comments, `: progress {"done", "total", "eta_s"}`.
    They may start the event stream (headers) before the first data event."""

    async def _start_stream(self, send) -> None:
        if not self.started_http:
            await start_sse(send)
            self.started_http = True

    async def progress(self, send, p: Progress) -> None:
        if not self.stream:
            return
        await self._start_stream(send)
        body = {"done": p.done, "total": p.total, "eta_s": p.eta_s}
        await send_comment(send, "progress " + json.dumps(body, separators=(",", ":")))


CHAT_FINISH = {"stop": "stop", "stop_sequence": "stop", "tool_calls": "tool_calls", "length": "length"}


def chat_finish(end: ReplyEnd) -> str:
    """How the reply ended (reply_end) in chat's words: `finish_reason`."""
    return CHAT_FINISH[end.finish]


def reply_parser(thinking: bool, tools: list | None, *, chat=None, **kw) -> OutputParserBase:
    """The parser every API responder reads: a tool call's events only once its invoke closed, so no
    reply, streamed or not, carries a call that was then cut off (reply_end). chat: the model family's
    chat half (API.chat; None: DeepSeek-V4's) whose OutputParser reads what the model writes."""
    cls = (chat if chat is not None else chat_family()).OutputParser
    return cls(thinking=thinking, tools=tools, whole_calls=True, **kw)


def _warn(api, rid: str, parser: OutputParserBase) -> None:
    for w in parser.result.warnings:
        api.log.warning("model_output_malformed", request_id=rid, problem=w)


class ContentLogprobs:
    """Which tokens' log-probabilities a chat reply carries: those of content tokens, as OpenAI's
    `logprobs.content` (reasoning, the think marker and tool-call tokens have none). A token the
    parser holds back (a possible marker) waits: its entry goes with the next content text, or is
    dropped when what it held turns out to be reasoning or a tool call."""

    def __init__(self) -> None:
        self._pending: list = []

    def route(self, events: list[Event], lp=None, held: bool = False) -> list[tuple[Event, list | None]]:
        """The events, each with the entries that ride on it (None: no logprobs field). `held`: the
        token was content text the parser holds back (it began and ended in the content state), so
        its entry waits; a token that produced no content otherwise (the `</think>` marker) has none."""
        if lp is not None and (held or any(ev.kind == "content" for ev in events)):
            self._pending.append(lp)
        out: list[tuple[Event, list | None]] = []
        for ev in events:
            if ev.kind == "content" and self._pending:
                out.append((ev, self._pending))
                self._pending = []
            else:
                if ev.kind != "content":
                    self._pending = []
                out.append((ev, None))
        return out


class ChatJSON(Responder):
    def __init__(self, api, rid, req, thinking: bool = False) -> None:
        super().__init__(api, rid)
        self.req = req
        self.thinking = thinking
        self.parser = reply_parser(thinking, req.callable_tools, chat=getattr(api, "chat", None))
        self.logprobs: list | None = [] if req.logprobs else None
        self.routed = ContentLogprobs()

    async def start(self, send, msg: Started) -> None:
        pass

    async def token(self, send, t: TokenOut) -> None:
        before = self.parser.state
        events = self.parser.feed(t.text)
        if self.logprobs is not None:
            self._keep(events, formats.chat_logprob(self.api.tok, t.token_id, t.logprob, t.top),
                       held=before == self.parser.state == "content")

    def _keep(self, events: list[Event], lp=None, held: bool = False) -> None:
        for _, lps in self.routed.route(events, lp, held):
            self.logprobs.extend(lps or ())

    async def done(self, send, d: Done) -> None:
        events, end = end_reply(self.parser, d)
        if self.logprobs is not None:
            self._keep(events)
        _warn(self.api, self.rid, self.parser)
        r = self.parser.result
        message = formats.chat_message(r.content, reasoning=r.reasoning if self.thinking else None,
                                       tool_calls=list(end.tool_calls))
        body = formats.chat_completion(self.rid, int(time.time()), self.api.model_id, message,
                                       chat_finish(end), d.usage, self.logprobs, self.api.fingerprint)
        await send_json(send, 200, body)


class ChatStream(StreamProgress):
    stream = True

    def __init__(self, api, rid, req, thinking: bool = False) -> None:
        super().__init__(api, rid)
        self.req = req
        self.created = int(time.time())
        self.parser = reply_parser(thinking, req.callable_tools, chat=getattr(api, "chat", None))
        self.routed = ContentLogprobs()

    def _chunk(self, delta, **kw) -> dict:
        return formats.chat_chunk(self.rid, self.created, self.api.model_id, delta,
                                  fingerprint=self.api.fingerprint, include_usage=self.req.common.include_usage, **kw)

    async def start(self, send, msg: Started) -> None:
        await self._start_stream(send)
        await send_event(send, self._chunk({"role": "assistant", "content": ""}))

    async def _events(self, send, events: list[Event], lp=None, held: bool = False) -> None:
        """One chunk per parser event; a content token's logprobs ride on its content (ContentLogprobs):
        never an empty delta, never on reasoning."""
        for ev, lps in self.routed.route(events, lp, held):
            if ev.kind == "content":
                delta = {"content": ev.text}
            elif ev.kind == "reasoning":
                delta = {"reasoning_content": ev.text}
            elif ev.kind == "tool_start":
                delta = {"tool_calls": [formats.tool_call(ev.id, ev.name, "", index=ev.index)]}
            else:
                delta = {"tool_calls": [{"index": ev.index, "function": {"arguments": ev.text}}]}
            await send_event(send, self._chunk(delta, logprobs=lps))

    async def token(self, send, t: TokenOut) -> None:
        lp = formats.chat_logprob(self.api.tok, t.token_id, t.logprob, t.top) if self.req.logprobs else None
        before = self.parser.state
        events = self.parser.feed(t.text)
        await self._events(send, events, lp, held=before == self.parser.state == "content")

    async def done(self, send, d: Done) -> None:
        events, end = end_reply(self.parser, d)
        await self._events(send, events)
        _warn(self.api, self.rid, self.parser)
        await send_event(send, self._chunk({}, finish=chat_finish(end)))
        if self.req.common.include_usage:
            await send_event(send, self._chunk({}, usage=d.usage, no_choices=True))
        await end_sse(send)


class CompletionOut(StreamProgress):
    def __init__(self, api, rid, req, ids) -> None:
        super().__init__(api, rid)
        self.req, self.ids = req, ids
        self.stream = req.common.stream
        self.created = int(time.time())
        # Only echo shows the prompt: decoding thousands of ids costs ~1.5 ms on the event loop.
        self.prompt_text = (req.prompt_text if req.prompt_text is not None else api.tok.decode(ids)) if req.echo else ""
        self.text: list[str] = [self.prompt_text] if req.echo else []
        self.lp = formats.LegacyLogprobs(api.tok) if req.logprobs is not None else None

    def _body(self, text, finish=None, usage=None, logprobs=None) -> dict:
        return formats.completion(self.rid, self.created, self.api.model_id, text, finish, usage, logprobs,
                                  self.api.fingerprint, chunk=self.stream)

    async def start(self, send, msg: Started) -> None:
        echo_lp = None
        if self.req.echo and self.lp is not None:
            pl = msg.prompt_logprobs
            for i, t in enumerate(self.ids):
                lp = None if pl is None or i == 0 else pl.logprobs[i]
                top = () if pl is None or i == 0 else pl.top[i]
                self.lp.add(t, lp, top)
            echo_lp = self.lp.as_dict()
        if self.stream:
            await self._start_stream(send)
            if self.req.echo:
                await send_event(send, self._body(self.prompt_text, logprobs=echo_lp))

    async def token(self, send, t: TokenOut) -> None:
        piece = None
        if self.lp is not None:
            piece = self.lp.add(t.token_id, t.logprob, t.top)
        if self.stream:
            if t.text or piece is not None:
                await send_event(send, self._body(t.text, logprobs=piece))
        else:
            self.text.append(t.text)

    async def done(self, send, d: Done) -> None:
        if self.stream:
            if d.text_tail:
                await send_event(send, self._body(d.text_tail))
            await send_event(send, self._body("", finish=d.finish_reason))
            if self.req.common.include_usage:
                body = self._body("", usage=d.usage)
                body["choices"] = []
                await send_event(send, body)
            await end_sse(send)
            return
        self.text.append(d.text_tail)
        await send_json(send, 200, self._body("".join(self.text), d.finish_reason, d.usage,
                                              None if self.lp is None else self.lp.as_dict()))
