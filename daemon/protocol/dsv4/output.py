"""What DeepSeek-V4 writes -> OpenAI message parts: reasoning, content, tool calls. Pure, incremental.

One parser serves both the streamed and the whole reply (the whole reply is fed through the same
`feed`), so both carry the same content, reasoning and arguments by construction.

- Thinking mode: the prompt ends with `<think>`; text up to `</think>` is reasoning.
- When the request offered tools, a DSML block `<｜DSML｜tool_calls>` … `</｜DSML｜tool_calls>` after
  the content holds the calls; whitespace before it belongs to the format, not the content.
- Streaming lookahead: text that could still be the start of a marker (`</think>`, the block opener,
  trailing whitespace before it, a parameter's end) is held back until it is decided.
- Tool calls: at `<｜DSML｜invoke name=…>` one event with the id and name; then arguments fragments
  that concatenate to the final JSON arguments. A string parameter streams as it arrives: `{"p": "`,
  then its text JSON-escaped piece by piece, then `"` at its end; any other parameter is one
  fragment when complete (`, "q": 10`); the invoke's end adds `}`. `string="true"` values are JSON
  strings; `string="false"` values are JSON, typed by the tool's schema where the model's text does
  not parse.
- Linear: the text is scanned once. The parser keeps a position in its buffer instead of slicing it,
  and a feed looks only at the new text plus the few held-back characters (`scanned` counts them).
- A call cut off by the end of the output is dropped, never closed (`dropped_call`; docs/api.md).
- `whole_calls=True` (every API responder): a call's events wait until its invoke closes, then come
  as its `tool_start` and one `tool_args` with the whole arguments; a call that is cut off or
  malformed is never emitted, so no stream can carry part of a call an agent might run.
- A malformed block is not lost: its raw text is returned as content and `warnings` says why.
"""

from __future__ import annotations

import json
import re
import secrets
from ..events import Event, Parsed, ToolCall
from .encoding import DSML, END_THINK, INVOKE_CLOSE, PARAM_CLOSE, TOOL_CALLS_CLOSE, TOOL_CALLS_OPEN

_INVOKE_OPEN = f"<{DSML}invoke name=\""
_PARAM_OPEN = f"<{DSML}parameter name=\""
_INVOKE_RE = re.compile(rf'\s*<{DSML}invoke name="([^"\n]*)">')
_PARAM_RE = re.compile(rf'\s*<{DSML}parameter name="([^"\n]*)" string="(true|false)">')
_INVOKE_END_RE = re.compile(rf"\s*{re.escape(INVOKE_CLOSE)}")
_BLOCK_END_RE = re.compile(rf"\s*{re.escape(TOOL_CALLS_CLOSE)}")
# A tag still open after this many characters is not one (a name is an identifier): malformed,
# which also keeps a tag that never closes from being re-matched on every feed.
_MAX_TAG = 1024


def _param_types(tools: list | None) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for t in tools or []:
        f = t.get("function", t) if isinstance(t, dict) else {}
        props = ((f.get("parameters") or {}).get("properties") or {}) if isinstance(f, dict) else {}
        out[f.get("name", "")] = {k: (v.get("type") if isinstance(v, dict) else None) for k, v in props.items()}
    return out


def _held_suffix(buf: str, marker: str, start: int = 0) -> int:
    """Length of the longest suffix of buf[start:] that is a proper prefix of marker."""
    for n in range(min(len(marker) - 1, len(buf) - start), 0, -1):
        if buf.endswith(marker[:n]):
            return n
    return 0


def _escaped(text: str) -> str:
    """Text as the inside of a JSON string; pieces escaped one by one concatenate to the whole's escape."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


class OutputParser:
    def __init__(self, *, thinking: bool, tools: list | None, new_id=None, whole_calls: bool = False) -> None:
        # reasoning | content | block (between calls) | call (in an invoke) | param (in a value) | after
        self.state = "reasoning" if thinking else "content"
        self.buf = ""
        self.pos = 0               # buf[:pos] is decided; feed drops it before appending
        self.scanned = 0           # characters the scans examined (a test holds this linear)
        self.types = _param_types(tools)
        self.tools_on = tools is not None and len(tools) > 0
        self.new_id = new_id or (lambda: "call_" + secrets.token_hex(12))
        self.result = Parsed()
        self._raw: list[str] = []  # block text since its start or the last closed call (if malformed)
        self._open: ToolCall | None = None
        self._n_params = 0
        self._key = ""             # the open parameter: name, streamed as a JSON string?, pieces
        self._streams = False
        self._pieces: list[str] = []
        self.whole_calls = whole_calls
        self._held: Event | None = None   # whole_calls: the open call's tool_start, emitted when it closes

    # --- public ------------------------------------------------------------------------------

    def feed(self, text: str) -> list[Event]:
        if self.pos:
            self.buf = self.buf[self.pos:]
            self.pos = 0
        self.buf += text
        return self._run(final=False)

    def finish(self) -> list[Event]:
        events = self._run(final=True)
        if self.state in ("block", "call", "param"):
            self._cut_off()
        elif self.pos < len(self.buf):
            rest = self.buf[self.pos:]
            if self.state == "content" and self.tools_on and _held_suffix(rest, TOOL_CALLS_OPEN) > 1:
                # cut off inside the block's opener `<｜DSML｜tool_ca`: the format's text, not content
                rest = rest[: len(rest) - _held_suffix(rest, TOOL_CALLS_OPEN)].rstrip()
            events += self._emit("reasoning" if self.state == "reasoning" else "content", rest)
        self.buf, self.pos = "", 0
        return events

    # --- machinery ---------------------------------------------------------------------------

    def _emit(self, kind: str, text: str) -> list[Event]:
        if not text:
            return []
        (self.result._reasoning if kind == "reasoning" else self.result._content).add(text)
        return [Event("reasoning" if kind == "reasoning" else "content", text)]

    def _find(self, marker: str) -> int:
        i = self.buf.find(marker, self.pos)
        self.scanned += (len(self.buf) if i < 0 else i + len(marker)) - self.pos
        return i

    def _match(self, pattern: re.Pattern):
        m = pattern.match(self.buf, self.pos)
        self.scanned += (m.end() - self.pos) if m else min(len(self.buf) - self.pos, _MAX_TAG)
        return m

    def _take(self, end: int) -> str:
        """Consume buf[pos:end] inside the block (kept raw in case the block turns out malformed)."""
        text = self.buf[self.pos:end]
        self._raw.append(text)
        self.pos = end
        return text

    def _run(self, final: bool) -> list[Event]:
        events: list[Event] = []
        step = {"reasoning": self._reasoning, "content": self._content, "block": self._block,
                "call": self._call, "param": self._param}
        while True:
            before = (self.state, self.pos)
            if self.state == "after":     # after the block: whatever follows is content
                events += self._emit("content", self.buf[self.pos:])
                self.pos = len(self.buf)
            else:
                events += step[self.state](final)
            if (self.state, self.pos) == before:
                return events

    def _reasoning(self, final: bool) -> list[Event]:
        i = self._find(END_THINK)
        if i >= 0:
            out = self._emit("reasoning", self.buf[self.pos:i])
            self.pos = i + len(END_THINK)
            self.state = "content"
            return out
        end = len(self.buf) - (0 if final else _held_suffix(self.buf, END_THINK, self.pos))
        out = self._emit("reasoning", self.buf[self.pos:end])
        self.pos = end
        return out

    def _content(self, final: bool) -> list[Event]:
        if not self.tools_on:            # no tools offered: DSML text is just text
            out = self._emit("content", self.buf[self.pos:])
            self.pos = len(self.buf)
            return out
        i = self._find(TOOL_CALLS_OPEN)
        if i >= 0:
            body = self.buf[self.pos:i]
            kept = body.rstrip()
            out = self._emit("content", kept)
            # the whitespace before the block, kept in case the block turns out malformed
            self._raw = [body[len(kept):] + TOOL_CALLS_OPEN]
            self.pos = i + len(TOOL_CALLS_OPEN)
            self.state = "block"
            return out
        if final:
            return []
        end = len(self.buf) - _held_suffix(self.buf, TOOL_CALLS_OPEN, self.pos)
        body = self.buf[self.pos:end]
        end -= len(body) - len(body.rstrip())       # whitespace may precede a block: hold it too
        out = self._emit("content", self.buf[self.pos:end])
        self.pos = end
        return out

    def _block(self, final: bool) -> list[Event]:
        m = self._match(_INVOKE_RE)
        if m:
            call = ToolCall(self.new_id(), m.group(1))
            self.result.tool_calls.append(call)
            self._open, self._n_params = call, 0
            self._take(m.end())
            self.state = "call"
            start = Event("tool_start", index=len(self.result.tool_calls) - 1, id=call.id, name=call.name)
            if self.whole_calls:
                self._held = start
                return []
            return [start]
        m = self._match(_BLOCK_END_RE)
        if m:
            self._take(m.end())
            self.state = "after"
            return []
        return self._undecided((_INVOKE_OPEN, TOOL_CALLS_CLOSE), final)

    def _call(self, final: bool) -> list[Event]:
        m = self._match(_PARAM_RE)
        if m:
            self._take(m.end())
            self._key, self._pieces = m.group(1), []
            want = self.types.get(self._open.name, {}).get(self._key)
            # a string parameter streams as it arrives; anything else is typed when complete
            self._streams = m.group(2) == "true" and want in (None, "string") or want == "string"
            self.state = "param"
            return self._args(self._key_fragment() + '"') if self._streams else []
        m = self._match(_INVOKE_END_RE)
        if m:
            self._take(m.end())
            out = self._args("{}" if self._n_params == 0 else "}")
            if self.whole_calls:      # the call closed: now it is one, whole
                out = [self._held, Event("tool_args", self._open.arguments, index=self._held.index)]
                self._held = None
            self._open, self._raw = None, []
            self.state = "block"
            return out
        return self._undecided((_PARAM_OPEN, INVOKE_CLOSE), final)

    def _param(self, final: bool) -> list[Event]:
        i = self._find(PARAM_CLOSE)
        end = i if i >= 0 else len(self.buf) - (0 if final else _held_suffix(self.buf, PARAM_CLOSE, self.pos))
        piece = self._take(end)
        if i < 0:
            if not self._streams:
                self._pieces.append(piece)
                return []
            return self._args(_escaped(piece)) if piece else []
        self._take(i + len(PARAM_CLOSE))
        self.state = "call"
        if self._streams:
            frag = _escaped(piece) + '"'
        else:
            self._pieces.append(piece)
            frag = self._key_fragment() + self._value("".join(self._pieces))
        self._n_params += 1
        return self._args(frag)

    def _key_fragment(self) -> str:
        return ("{" if self._n_params == 0 else ", ") + json.dumps(self._key, ensure_ascii=False) + ": "

    def _args(self, frag: str) -> list[Event]:
        self._open._arguments.add(frag)
        if self.whole_calls:
            return []
        return [Event("tool_args", frag, index=len(self.result.tool_calls) - 1)]

    def _undecided(self, openers: tuple[str, ...], final: bool) -> list[Event]:
        rest = self.buf[self.pos:self.pos + _MAX_TAG].lstrip()
        if not rest:
            return []
        could_be = any(o.startswith(rest) or (rest.startswith(o) and '">' not in rest) for o in openers)
        if could_be and len(self.buf) - self.pos < _MAX_TAG:
            return []        # still could become what is expected: wait for more text (or cut off: finish)
        return self._malformed(f"expected one of {', '.join(openers)} at {rest[:40]!r}")

    def _cut_off(self) -> None:
        """The output ended inside the block (max_tokens, a stop string): calls already closed stay;
        an open call is dropped, not closed, and none of the block's raw text becomes content."""
        if self._open is not None:
            self._drop_open("cut_off")
            self.result.warnings.append("a tool call was cut off by the end of the output; it was dropped")
        self.state = "after"

    def _drop_open(self, why: str) -> None:
        self.result.tool_calls.remove(self._open)
        self._open, self._held = None, None
        self.result.dropped_call, self.result.dropped_why = True, why

    def _malformed(self, why: str) -> list[Event]:
        """The block's raw text since its start or its last closed call becomes content; an open call
        is dropped (an agent would run it)."""
        if self._open is not None:
            self._drop_open("malformed")
        self.result.warnings.append(f"malformed tool-call block: {why}")
        raw = "".join(self._raw) + self.buf[self.pos:]
        self._raw = []
        self.pos = len(self.buf)
        self.state = "after"
        return self._emit("content", raw)

    def _value(self, raw: str) -> str:
        """A non-string parameter's value as JSON: the model's text if it parses, else that text as a string."""
        try:
            return json.dumps(json.loads(raw), ensure_ascii=False)
        except (ValueError, RecursionError):   # RecursionError: a reply of thousands of `[`
            return json.dumps(raw, ensure_ascii=False)    # not JSON after all: keep the text


def parse_all(text: str, *, thinking: bool, tools: list | None) -> Parsed:
    p = OutputParser(thinking=thinking, tools=tools)
    p.feed(text)
    p.finish()
    return p.result
