"""Anthropic Messages API replies: the chat pipeline's OutputParser events -> Anthropic content
blocks, as one JSON message or as Anthropic's SSE event sequence.

Both modes build their blocks with the same `Blocks` from the same parser events, so a streamed
reply and a whole one carry the same blocks by construction. The stream is, as Anthropic sends it:

    message_start, ping,
    (content_block_start, content_block_delta*, content_block_stop)*   # thinking / text / tool_use
    message_delta (stop_reason, stop_sequence, usage), message_stop

each as `event: NAME` + `data: {...}`; a failure after the stream has started is `event: error`.
A tool_use block goes out once its call closed (start, one input_json_delta, stop): a call cut off
by max_tokens is never sent, and stop_reason says `max_tokens` (reply_end).
Prefill progress before message_start stays cairn's SSE comments (`: progress {...}`), which SSE
clients, Anthropic's SDKs among them, skip.

`diagnostics` (the message's, and message_start's in a stream) answers the request's `diagnostics`
field (api/cache_diagnostics.py): null unless a comparison found a divergence or no earlier response.

Usage: `input_tokens` are the prompt tokens not read from a checkpoint, `cache_read_input_tokens`
those that were (so input + cache_read is the whole prompt, as Anthropic counts it); cairn caches
every prefix on its own, so `cache_creation_input_tokens` is 0.
"""

from __future__ import annotations

import hashlib
import json
import secrets

from cairn.actors.engine.messages import Done, Started, TokenOut, Usage
from cairn.daemon.protocol.reply_end import ReplyEnd, end_reply
from cairn.daemon.protocol.output_parser import OutputParserBase
from cairn.daemon.protocol.events import Event

from .anthropic import error_body
from .asgi import send_json
from .responders import Responder, StreamProgress, reply_parser
from .schemas import APIError


def usage_dict(u: Usage) -> dict:
    return {"input_tokens": u.prompt_tokens - u.cached_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": u.cached_tokens, "output_tokens": u.completion_tokens}


STOP_REASON = {"stop": "end_turn", "stop_sequence": "stop_sequence", "tool_calls": "tool_use", "length": "max_tokens"}


def stop_reason(end: ReplyEnd) -> tuple[str, str | None]:
    """How the reply ended (reply_end) in Anthropic's words: (stop_reason, stop_sequence)."""
    return STOP_REASON[end.finish], end.stop_sequence


def new_tool_id() -> str:
    return "toolu_" + secrets.token_hex(12)


def omits_thinking(req) -> bool:
    """The request asked for thinking blocks without their text (`thinking.display: "omitted"`)."""
    return isinstance(req.thinking, dict) and req.thinking.get("display") == "omitted"


def signature(thinking: str) -> str:
    """An opaque `signature` for a thinking block (Anthropic's clients expect one). Nothing checks it:
    a thinking block sent back is read as text whatever its signature."""
    return "cairn." + hashlib.sha256(thinking.encode()).hexdigest()[:32]


class Blocks:
    """Parser events -> Anthropic content blocks in order, and the stream events that build them:
    (event name, data) pairs. A block opens at the first event of its kind and closes at the next
    block or at `close`."""

    def __init__(self, omit_thinking: bool = False) -> None:
        self.blocks: list[dict] = []
        # thinking.display "omitted": thinking blocks carry no text, only their signature (Anthropic's
        # documented shape); what the client sends back is then keyed without it (api/app.py _keep_reply)
        self.omit_thinking = omit_thinking
        self._hidden: dict[int, list[str]] = {}   # block index -> the omitted thinking text (its signature)
        self._open: int | None = None
        self._args: dict[int, str] = {}        # block index -> the tool call's JSON arguments so far
        self._tool_block: dict[int, int] = {}  # the parser's call index -> block index

    def add(self, ev: Event) -> list[tuple[str, dict]]:
        out: list[tuple[str, dict]] = []
        if ev.kind in ("reasoning", "content"):
            kind = "thinking" if ev.kind == "reasoning" else "text"
            if self._open is None or self.blocks[self._open]["type"] != kind:
                out += self.close()
                out += self._start({"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking"
                                   else {"type": "text", "text": ""})
            if kind == "thinking" and self.omit_thinking:
                self._hidden.setdefault(self._open, []).append(ev.text)
                return out
            self.blocks[self._open][kind] += ev.text
            delta = {"type": "thinking_delta", "thinking": ev.text} if kind == "thinking" else \
                {"type": "text_delta", "text": ev.text}
            out.append(self._delta(self._open, delta))
        elif ev.kind == "tool_start":
            out += self.close()
            out += self._start({"type": "tool_use", "id": ev.id, "name": ev.name, "input": {}})
            self._tool_block[ev.index] = self._open
            self._args[self._open] = ""
        elif ev.kind == "tool_args":
            i = self._tool_block[ev.index]
            self._args[i] += ev.text
            out.append(self._delta(i, {"type": "input_json_delta", "partial_json": ev.text}))
        return out

    def close(self) -> list[tuple[str, dict]]:
        if self._open is None:
            return []
        i, self._open = self._open, None
        b = self.blocks[i]
        out = []
        if b["type"] == "thinking":
            b["signature"] = signature(b["thinking"] or "".join(self._hidden.get(i, ())))
            out.append(self._delta(i, {"type": "signature_delta", "signature": b["signature"]}))
        elif b["type"] == "tool_use":
            b["input"] = _input(self._args[i])
        out.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
        return out

    def _start(self, block: dict) -> list[tuple[str, dict]]:
        self.blocks.append(dict(block))
        self._open = len(self.blocks) - 1
        return [("content_block_start", {"type": "content_block_start", "index": self._open,
                                         "content_block": block})]

    @staticmethod
    def _delta(i: int, delta: dict) -> tuple[str, dict]:
        return ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta})


def _input(arguments: str) -> dict:
    """A call's arguments as the tool_use block's input (the parser closes every call's JSON)."""
    try:
        value = json.loads(arguments or "{}")
    except (ValueError, RecursionError):
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


def message(rid: str, model: str, content: list[dict], stop: str | None, stop_sequence: str | None,
            usage: dict, diagnostics: dict | None = None) -> dict:
    # diagnostics: the cache comparison the request asked for (cache_diagnostics.anthropic_diagnostics),
    # null when it asked none, on a first turn, or when nothing diverged
    return {"id": rid, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop, "stop_sequence": stop_sequence, "usage": usage, "diagnostics": diagnostics}


async def send_anthropic_error(send, err: APIError) -> None:
    status, body = error_body(err)
    await send_json(send, status, body, err.headers)


async def send_named(send, name: str, data: dict, *, more: bool = True) -> None:
    await send({"type": "http.response.body", "body": b"event: " + name.encode() + b"\ndata: "
                + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n", "more_body": more})


def _warn(api, rid: str, parser: OutputParserBase) -> None:
    for w in parser.result.warnings:
        api.log.warning("model_output_malformed", request_id=rid, problem=w)


class MessagesJSON(Responder):
    """A whole reply: one `message` object."""

    def __init__(self, api, rid: str, req, n_prompt: int, thinking: bool = False, diagnostics: dict | None = None
                 ) -> None:
        super().__init__(api, rid)
        self.parser = reply_parser(thinking, req.callable_tools, new_id=new_tool_id,
                                   chat=getattr(api, "chat", None))
        self.blocks = Blocks(omit_thinking=omits_thinking(req))
        self.omits_reasoning = self.blocks.omit_thinking   # what the reply table keys on (api/app.py)
        self.diagnostics = diagnostics

    async def start(self, send, msg: Started) -> None:
        pass

    async def token(self, send, t: TokenOut) -> None:
        for ev in self.parser.feed(t.text):
            self.blocks.add(ev)

    async def done(self, send, d: Done) -> None:
        events, end = end_reply(self.parser, d)
        for ev in events:
            self.blocks.add(ev)
        self.blocks.close()
        _warn(self.api, self.rid, self.parser)
        stop, seq = stop_reason(end)
        await send_json(send, 200, message(self.rid, self.api.model_id, self.blocks.blocks, stop, seq,
                                           usage_dict(d.usage), self.diagnostics))

    async def failed(self, send, err: APIError) -> None:
        await send_anthropic_error(send, err)


class MessagesStream(StreamProgress):
    """A streamed reply: Anthropic's event sequence (module docstring)."""
    stream = True

    def __init__(self, api, rid: str, req, n_prompt: int, thinking: bool = False, diagnostics: dict | None = None
                 ) -> None:
        super().__init__(api, rid)
        self.n_prompt = n_prompt
        self.parser = reply_parser(thinking, req.callable_tools, new_id=new_tool_id,
                                   chat=getattr(api, "chat", None))
        self.blocks = Blocks(omit_thinking=omits_thinking(req))
        self.omits_reasoning = self.blocks.omit_thinking   # what the reply table keys on (api/app.py)
        self.diagnostics = diagnostics     # on message_start, as Anthropic sends it

    async def start(self, send, msg: Started) -> None:
        await self._start_stream(send)
        usage = usage_dict(Usage(self.n_prompt, 0, msg.reused_tokens))
        await send_named(send, "message_start", {"type": "message_start", "message": message(
            self.rid, self.api.model_id, [], None, None, usage, self.diagnostics)})
        await send_named(send, "ping", {"type": "ping"})

    async def _send(self, send, events: list[tuple[str, dict]]) -> None:
        for name, data in events:
            await send_named(send, name, data)

    async def token(self, send, t: TokenOut) -> None:
        for ev in self.parser.feed(t.text):
            await self._send(send, self.blocks.add(ev))

    async def done(self, send, d: Done) -> None:
        events, end = end_reply(self.parser, d)
        for ev in events:
            await self._send(send, self.blocks.add(ev))
        await self._send(send, self.blocks.close())
        _warn(self.api, self.rid, self.parser)
        stop, seq = stop_reason(end)
        await send_named(send, "message_delta", {"type": "message_delta",
                                                 "delta": {"stop_reason": stop, "stop_sequence": seq},
                                                 "usage": usage_dict(d.usage)})
        await send_named(send, "message_stop", {"type": "message_stop"}, more=False)

    async def failed(self, send, err: APIError) -> None:
        if not self.started_http:
            return await send_anthropic_error(send, err)
        await send_named(send, "error", error_body(err)[1], more=False)
