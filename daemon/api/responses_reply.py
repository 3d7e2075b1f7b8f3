"""Replies for `POST /v1/responses`: the shared OutputParser's events -> Responses output items and
their stream events.

`ReplyBuilder` is pure: each parser Event becomes the events the Responses stream defines, without
sequence numbers (the stream responder numbers them as it sends), while it builds the output items
the final `response` object carries. The JSON responder feeds the same builder and drops the events,
so a streamed and a whole reply carry the same items by construction.

Items, in the order the model writes them: a `reasoning` item (thinking mode), a `message` with one
`output_text` part, then one `function_call` per call (the parser's call id is the `call_id`).
The reasoning item carries the reasoning as its `content` (`reasoning_text`), as its `summary` when
the request asks for one (no summarizer here: the summary is the reasoning itself), and as
`encrypted_content` when `include` asks for it (responses.ENCRYPTED_PREFIX; not encrypted).
A function_call item is sent once its call closed (added, one arguments delta, done): a call cut off
by max_output_tokens is never an item, and the response is `incomplete` (reply_end).
"""

from __future__ import annotations

import json
import secrets
import time

from cairn.actors.engine.messages import Done, Started, TokenOut, Usage

from .asgi import send_error, send_json
from .responders import StreamProgress, _warn, reply_parser
from .responses import ResponsesRequest, encrypt_reasoning
from .schemas import APIError
from cairn.daemon.protocol.reply_end import ReplyEnd, end_reply
from cairn.daemon.protocol.events import Event


def usage_dict(u: Usage, reasoning_tokens: int = 0) -> dict:
    # cache_write_tokens: the SDK's type requires it; what a request adds to the checkpoint store is
    # not counted per request, so it is 0.
    return {"input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": u.prompt_tokens + u.completion_tokens}


def _item_id(kind: str) -> str:
    return f"{kind}_{secrets.token_hex(12)}"


class ReplyBuilder:
    def __init__(self, req: ResponsesRequest) -> None:
        self.req = req
        self.items: list[dict] = []
        self._open: dict | None = None       # the item being written
        self._calls: dict[int, dict] = {}    # parser tool index -> its function_call item
        self._index: dict[str, int] = {}     # item id -> output_index

    # --- parser events -> stream events ------------------------------------------------------

    def feed(self, events: list[Event]) -> list[dict]:
        out: list[dict] = []
        for ev in events:
            if ev.kind == "reasoning":
                if self._kind() != "reasoning":
                    out += self._close() + self._open_reasoning()
                out += self._reasoning_delta(ev.text)
            elif ev.kind == "content":
                if self._kind() != "message":
                    out += self._close() + self._open_message()
                out += self._text_delta(ev.text)
            elif ev.kind == "tool_start":
                out += self._close() + self._open_call(ev)
            else:   # tool_args: the call's whole arguments (whole_calls: it came once closed), so it is done
                item = self._calls[ev.index]
                item["arguments"] += ev.text
                out.append(self._at(item, "response.function_call_arguments.delta", delta=ev.text))
                out += self._close()
        return out

    def finish(self, status: str = "completed") -> list[dict]:
        """Close the last item; `incomplete` when the reply was cut off (max_output_tokens)."""
        return self._close(status)

    # --- items ---------------------------------------------------------------------------------

    def _kind(self) -> str | None:
        return None if self._open is None else self._open["type"]

    def _add(self, item: dict) -> list[dict]:
        self._index[item["id"]] = len(self.items)
        self.items.append(item)
        self._open = item
        return [{"type": "response.output_item.added", "output_index": len(self.items) - 1,
                 "item": json.loads(json.dumps(item))}]       # a snapshot: the item grows after

    def _at(self, item: dict, kind: str, **kw) -> dict:
        return {"type": kind, "item_id": item["id"], "output_index": self._index[item["id"]], **kw}

    def _open_reasoning(self) -> list[dict]:
        item = {"id": _item_id("rs"), "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}
        out = self._add(item)
        item["content"].append({"type": "reasoning_text", "text": ""})
        out.append(self._at(item, "response.content_part.added", content_index=0,
                            part={"type": "reasoning_text", "text": ""}))
        if self.req.summary:
            item["summary"].append({"type": "summary_text", "text": ""})
            out.append(self._at(item, "response.reasoning_summary_part.added", summary_index=0,
                                part={"type": "summary_text", "text": ""}))
        return out

    def _reasoning_delta(self, text: str) -> list[dict]:
        item = self._open
        item["content"][0]["text"] += text
        out = [self._at(item, "response.reasoning_text.delta", content_index=0, delta=text)]
        if self.req.summary:
            item["summary"][0]["text"] += text
            out.append(self._at(item, "response.reasoning_summary_text.delta", summary_index=0, delta=text))
        return out

    def _open_message(self) -> list[dict]:
        item = {"id": _item_id("msg"), "type": "message", "role": "assistant", "status": "in_progress",
                "content": []}
        out = self._add(item)
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        item["content"].append(part)
        out.append(self._at(item, "response.content_part.added", content_index=0, part=dict(part)))
        return out

    def _text_delta(self, text: str) -> list[dict]:
        item = self._open
        item["content"][0]["text"] += text
        return [self._at(item, "response.output_text.delta", content_index=0, delta=text, logprobs=[])]

    def _open_call(self, ev: Event) -> list[dict]:
        item = {"id": _item_id("fc"), "type": "function_call", "status": "in_progress", "call_id": ev.id,
                "name": ev.name, "arguments": ""}
        self._calls[ev.index] = item
        return self._add(item)

    def _close(self, status: str = "completed") -> list[dict]:
        item, self._open = self._open, None
        if item is None:
            return []
        out: list[dict] = []
        if item["type"] == "reasoning":
            text = item["content"][0]["text"]
            out.append(self._at(item, "response.reasoning_text.done", content_index=0, text=text))
            out.append(self._at(item, "response.content_part.done", content_index=0,
                                part={"type": "reasoning_text", "text": text}))
            if self.req.summary:
                out.append(self._at(item, "response.reasoning_summary_text.done", summary_index=0, text=text))
                out.append(self._at(item, "response.reasoning_summary_part.done", summary_index=0,
                                    part={"type": "summary_text", "text": text}))
            if self.req.include_encrypted:
                item["encrypted_content"] = encrypt_reasoning(text)
        elif item["type"] == "message":
            part = item["content"][0]
            out.append(self._at(item, "response.output_text.done", content_index=0, text=part["text"], logprobs=[]))
            out.append(self._at(item, "response.content_part.done", content_index=0, part=dict(part)))
        else:
            out.append(self._at(item, "response.function_call_arguments.done", name=item["name"],
                                arguments=item["arguments"]))
        item["status"] = status
        out.append({"type": "response.output_item.done", "output_index": self._index[item["id"]],
                    "item": json.loads(json.dumps(item))})
        return out

    # --- the response object -------------------------------------------------------------------

    def response(self, rid: str, created: int, model: str, *, status: str, usage: dict | None = None,
                 error: dict | None = None, output: bool = True, diagnostics: dict | None = None) -> dict:
        r = self.req
        return {
            "id": rid, "object": "response", "created_at": created, "status": status, "model": model,
            "output": [json.loads(json.dumps(i)) for i in self.items] if output else [],
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": r.instructions, "max_output_tokens": r.max_output_tokens,
            "parallel_tool_calls": r.chat.parallel_tool_calls, "previous_response_id": None,
            "reasoning": {"effort": r.effort, "summary": r.summary},
            "store": False, "temperature": r.chat.common.temperature, "top_p": r.chat.common.top_p,
            "text": r.text, "tool_choice": r.tool_choice, "tools": r.tools, "truncation": "disabled",
            "usage": usage, "user": r.user, "metadata": r.metadata,
            # the comparison prompt_cache_options asked for (cache_diagnostics.openai_diagnostics), else null
            "prompt_cache_diagnostics": diagnostics,
        }


def _status(end: ReplyEnd) -> str:
    """How the reply ended (reply_end) in the Responses API's words: `incomplete` (with
    `incomplete_details.reason` `max_output_tokens`, ReplyBuilder.response) when the token limit cut it."""
    return "incomplete" if end.cut_off else "completed"


class _Base:
    """The parts both responders share: the parser (the same one chat uses), the builder, and a
    count of reasoning tokens (tokens sampled while the parser was in the reasoning)."""

    def _setup(self, api, rid, req: ResponsesRequest, thinking: bool, diagnostics: dict | None) -> None:
        self.req = req
        self.diagnostics = diagnostics
        self.created = int(time.time())
        self.parser = reply_parser(thinking, req.chat.callable_tools, chat=getattr(api, "chat", None))
        self.builder = ReplyBuilder(req)
        self.reasoning_tokens = 0

    def _feed(self, t: TokenOut) -> list[dict]:
        if self.parser.state == "reasoning":
            self.reasoning_tokens += 1
        return self.builder.feed(self.parser.feed(t.text))

    def _end(self, d: Done) -> tuple[list[dict], ReplyEnd]:
        parsed, end = end_reply(self.parser, d)
        events = self.builder.feed(parsed)
        _warn(self.api, self.rid, self.parser)
        return events + self.builder.finish(_status(end)), end

    def _final(self, d: Done, end: ReplyEnd) -> dict:
        return self.builder.response(self.rid, self.created, self.api.model_id, status=_status(end),
                                     usage=usage_dict(d.usage, self.reasoning_tokens), diagnostics=self.diagnostics)


class ResponsesJSON(StreamProgress, _Base):
    stream = False

    def __init__(self, api, rid, req: ResponsesRequest, thinking: bool = False, diagnostics: dict | None = None
                 ) -> None:
        super().__init__(api, rid)
        self._setup(api, rid, req, thinking, diagnostics)

    async def start(self, send, msg: Started) -> None:
        pass

    async def token(self, send, t: TokenOut) -> None:
        self._feed(t)

    async def done(self, send, d: Done) -> None:
        _, end = self._end(d)
        await send_json(send, 200, self._final(d, end))


def _sse(event: dict) -> bytes:
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


class ResponsesStream(StreamProgress, _Base):
    """`event: <type>` + `data: {…}` per event, as OpenAI sends them; the stream ends after
    `response.completed` / `response.incomplete` / `response.failed` (no `[DONE]`)."""
    stream = True

    def __init__(self, api, rid, req: ResponsesRequest, thinking: bool = False, diagnostics: dict | None = None
                 ) -> None:
        super().__init__(api, rid)
        self._setup(api, rid, req, thinking, diagnostics)
        self.seq = 0
        self.created_sent = False

    async def _send(self, send, events: list[dict], *, last: bool = False) -> None:
        body = b""
        for ev in events:
            body += _sse({**ev, "sequence_number": self.seq})
            self.seq += 1
        if body or last:
            await send({"type": "http.response.body", "body": body, "more_body": not last})

    async def _created(self, send) -> None:
        await self._start_stream(send)
        if not self.created_sent:
            self.created_sent = True
            r = self.builder.response(self.rid, self.created, self.api.model_id, status="in_progress")
            await self._send(send, [{"type": "response.created", "response": r},
                                    {"type": "response.in_progress", "response": r}])

    async def start(self, send, msg: Started) -> None:
        await self._created(send)

    async def token(self, send, t: TokenOut) -> None:
        await self._send(send, self._feed(t))

    async def done(self, send, d: Done) -> None:
        events, end = self._end(d)
        final = self._final(d, end)
        await self._send(send, events + [{"type": f"response.{final['status']}", "response": final}], last=True)

    async def failed(self, send, err: APIError) -> None:
        if not self.started_http:
            return await send_error(send, err)
        await self._created(send)
        # ResponseError.code takes OpenAI's codes only; cairn's own code rides on the `error` event
        failed = self.builder.response(self.rid, self.created, self.api.model_id, status="failed",
                                       error={"code": "server_error", "message": err.message})
        await self._send(send, [{"type": "error", "code": err.code, "message": err.message, "param": err.param},
                                {"type": "response.failed", "response": failed}], last=True)
