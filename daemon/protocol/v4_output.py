"""What DeepSeek-V4 writes -> OpenAI message parts: reasoning, content, tool calls. Pure, incremental.

One parser serves both the streamed and the whole reply (the whole reply is fed through the same
`feed`), so both carry the same content, reasoning and arguments by construction.

- Thinking mode: the prompt ends with `<think>`; text up to `</think>` is reasoning.
- When the request offered tools, a DSML block `<｜DSML｜tool_calls>` … `</｜DSML｜tool_calls>` after
  the content holds the calls; whitespace before it belongs to the format, not the content.
- Streaming lookahead: text that could still be the start of a marker (`</think>`, the block opener,
  trailing whitespace before it) is held back until it is decided.
- Tool calls: at `<｜DSML｜invoke name=…>` one event with the id and name; each complete parameter
  adds an arguments fragment (`{"p": v` then `, "q": w`), and the invoke's end `}`: the fragments
  concatenate to the final JSON arguments. `string="true"` values are JSON strings; `string="false"`
  values are JSON, typed by the tool's schema where the model's text does not parse.
- A malformed block is not lost: its raw text is returned as content and `warnings` says why.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field

from .encoding_dsv4 import DSML, END_THINK, INVOKE_CLOSE, TOOL_CALLS_CLOSE, TOOL_CALLS_OPEN

_INVOKE_OPEN = f"<{DSML}invoke name=\""
_PARAM_OPEN = f"<{DSML}parameter name=\""
_INVOKE_RE = re.compile(rf'\s*<{DSML}invoke name="([^"\n]*)">')
_PARAM_RE = re.compile(rf'\s*<{DSML}parameter name="([^"\n]*)" string="(true|false)">(.*?)</{DSML}parameter>', re.S)
_INVOKE_END_RE = re.compile(rf"\s*{re.escape(INVOKE_CLOSE)}")
_BLOCK_END_RE = re.compile(rf"\s*{re.escape(TOOL_CALLS_CLOSE)}")


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str = ""


@dataclass
class Event:
    kind: str              # "reasoning" | "content" | "tool_start" | "tool_args"
    text: str = ""         # reasoning / content text, or an arguments fragment
    index: int = 0         # tool call index
    id: str = ""
    name: str = ""


def _param_types(tools: list | None) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for t in tools or []:
        f = t.get("function", t) if isinstance(t, dict) else {}
        props = ((f.get("parameters") or {}).get("properties") or {}) if isinstance(f, dict) else {}
        out[f.get("name", "")] = {k: (v.get("type") if isinstance(v, dict) else None) for k, v in props.items()}
    return out


def _held_suffix(buf: str, marker: str) -> int:
    """Length of the longest suffix of buf that is a proper prefix of marker."""
    for n in range(min(len(marker) - 1, len(buf)), 0, -1):
        if buf.endswith(marker[:n]):
            return n
    return 0


@dataclass
class Parsed:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    dropped_call: bool = False    # a call was started but never closed (cut off): it is not a call


class OutputParser:
    def __init__(self, *, thinking: bool, tools: list | None, new_id=None) -> None:
        self.state = "reasoning" if thinking else "content"
        self.buf = ""
        self.types = _param_types(tools)
        self.tools_on = tools is not None and len(tools) > 0
        self.new_id = new_id or (lambda: "call_" + secrets.token_hex(12))
        self.result = Parsed()
        self._block_raw = ""       # the block's text so far, whitespace before it included (if malformed)
        self._open: ToolCall | None = None
        self._n_params = 0

    # --- public ------------------------------------------------------------------------------

    def feed(self, text: str) -> list[Event]:
        self.buf += text
        return self._run(final=False)

    def finish(self) -> list[Event]:
        events = self._run(final=True)
        if self.state == "block":
            self._cut_off()
        elif self.buf:
            if self.state == "content" and self.tools_on and _held_suffix(self.buf, TOOL_CALLS_OPEN) > 1:
                # cut off inside the block's opener `<｜DSML｜tool_ca`: the format's text, not content
                self.buf = self.buf[: len(self.buf) - _held_suffix(self.buf, TOOL_CALLS_OPEN)].rstrip()
            events += self._emit(self.state if self.state != "after" else "content", self.buf)
            self.buf = ""
        return events

    # --- machinery ---------------------------------------------------------------------------

    def _emit(self, kind: str, text: str) -> list[Event]:
        if not text:
            return []
        if kind == "reasoning":
            self.result.reasoning += text
        else:
            self.result.content += text
        return [Event("reasoning" if kind == "reasoning" else "content", text)]

    def _run(self, final: bool) -> list[Event]:
        events: list[Event] = []
        while True:
            before = (self.state, len(self.buf))
            if self.state == "reasoning":
                events += self._reasoning(final)
            elif self.state == "content":
                events += self._content(final)
            elif self.state == "block":
                events += self._block(final)
            else:  # after the block: whatever follows is content
                events += self._emit("content", self.buf)
                self.buf = ""
            if (self.state, len(self.buf)) == before:
                return events

    def _reasoning(self, final: bool) -> list[Event]:
        i = self.buf.find(END_THINK)
        if i >= 0:
            out = self._emit("reasoning", self.buf[:i])
            self.buf = self.buf[i + len(END_THINK):]
            self.state = "content"
            return out
        keep = 0 if final else _held_suffix(self.buf, END_THINK)
        out = self._emit("reasoning", self.buf[: len(self.buf) - keep])
        self.buf = self.buf[len(self.buf) - keep:]
        return out

    def _content(self, final: bool) -> list[Event]:
        if not self.tools_on:            # no tools offered: DSML text is just text
            out = self._emit("content", self.buf)
            self.buf = ""
            return out
        i = self.buf.find(TOOL_CALLS_OPEN)
        if i >= 0:
            body = self.buf[:i].rstrip()
            out = self._emit("content", body)
            # the whitespace before the block, kept in case the block turns out malformed
            self._block_raw = self.buf[len(body): i + len(TOOL_CALLS_OPEN)]
            self.buf = self.buf[i + len(TOOL_CALLS_OPEN):]
            self.state = "block"
            return out
        if final:
            return []
        keep = _held_suffix(self.buf, TOOL_CALLS_OPEN)
        body = self.buf[: len(self.buf) - keep]
        ws = len(body) - len(body.rstrip())       # whitespace may precede a block: hold it too
        keep += ws
        out = self._emit("content", self.buf[: len(self.buf) - keep])
        self.buf = self.buf[len(self.buf) - keep:]
        return out

    def _block(self, final: bool) -> list[Event]:
        if self._open is None:
            m = _INVOKE_RE.match(self.buf)
            if m:
                call = ToolCall(self.new_id(), m.group(1))
                self.result.tool_calls.append(call)
                self._open, self._n_params = call, 0
                self._consume(m.end())
                return [Event("tool_start", index=len(self.result.tool_calls) - 1, id=call.id, name=call.name)]
            m = _BLOCK_END_RE.match(self.buf)
            if m:
                self._consume(m.end())
                self.state = "after"
                return []
            return self._undecided((_INVOKE_OPEN, TOOL_CALLS_CLOSE), final)
        m = _PARAM_RE.match(self.buf)
        if m:
            frag = ("{" if self._n_params == 0 else ", ") + json.dumps(m.group(1), ensure_ascii=False) + ": " + \
                self._value(self._open.name, m.group(1), m.group(3), m.group(2) == "true")
            self._n_params += 1
            self._consume(m.end())
            return [self._args(frag)]
        m = _INVOKE_END_RE.match(self.buf)
        if m:
            self._consume(m.end())
            ev = self._args("{}" if self._n_params == 0 else "}")
            self._open = None
            return [ev]
        return self._undecided((_PARAM_OPEN, INVOKE_CLOSE), final)

    def _args(self, frag: str) -> Event:
        self._open.arguments += frag
        return Event("tool_args", frag, index=len(self.result.tool_calls) - 1)

    def _consume(self, n: int) -> None:
        self._block_raw += self.buf[:n]
        self.buf = self.buf[n:]

    def _undecided(self, openers: tuple[str, ...], final: bool) -> list[Event]:
        rest = self.buf.lstrip()
        if not rest or any(o.startswith(rest) or rest.startswith(o) for o in openers):
            return []        # still could become what is expected: wait for more text (or cut off: finish)
        return self._malformed(f"expected one of {', '.join(openers)} at {rest[:40]!r}")

    def _cut_off(self) -> None:
        """The output ended inside the block (max_tokens, a stop string): calls already closed stay;
        an open call is dropped, not closed, and none of the block's raw text becomes content."""
        if self._open is not None:
            self._drop_open()
            self.result.warnings.append("a tool call was cut off by the end of the output; it was dropped")
        self.buf = ""
        self.state = "after"

    def _drop_open(self) -> None:
        self.result.tool_calls.remove(self._open)
        self._open = None
        self.result.dropped_call = True

    def _malformed(self, why: str) -> list[Event]:
        """The block's remaining raw text becomes content; an open call is dropped (an agent would run it)."""
        events: list[Event] = []
        if self._open is not None:
            self._drop_open()
        self.result.warnings.append(f"malformed tool-call block: {why}")
        raw = (self._block_raw if not self.result.tool_calls else "") + self.buf
        self.buf = ""
        self.state = "after"
        return events + self._emit("content", raw)

    def _value(self, tool: str, key: str, raw: str, is_string: bool) -> str:
        want = self.types.get(tool, {}).get(key)
        if is_string and want in (None, "string") or want == "string":
            return json.dumps(raw, ensure_ascii=False)
        try:
            return json.dumps(json.loads(raw), ensure_ascii=False)
        except (ValueError, RecursionError):   # RecursionError: a reply of thousands of `[`
            return json.dumps(raw, ensure_ascii=False)    # not JSON after all: keep the text


def parse_all(text: str, *, thinking: bool, tools: list | None) -> Parsed:
    p = OutputParser(thinking=thinking, tools=tools)
    p.feed(text)
    p.finish()
    return p.result
