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

from ..events import Event, Parsed
from ..output_parser import MAX_TAG, OutputParserBase, held_suffix
from .encoding import DSML, END_THINK, INVOKE_CLOSE, PARAM_CLOSE, TOOL_CALLS_CLOSE, TOOL_CALLS_OPEN

_INVOKE_OPEN = f"<{DSML}invoke name=\""
_PARAM_OPEN = f"<{DSML}parameter name=\""
_INVOKE_RE = re.compile(rf'\s*<{DSML}invoke name="([^"\n]*)">')
_PARAM_RE = re.compile(rf'\s*<{DSML}parameter name="([^"\n]*)" string="(true|false)">')
_INVOKE_END_RE = re.compile(rf"\s*{re.escape(INVOKE_CLOSE)}")
_BLOCK_END_RE = re.compile(rf"\s*{re.escape(TOOL_CALLS_CLOSE)}")


def _param_types(tools: list | None) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for t in tools or []:
        f = t.get("function", t) if isinstance(t, dict) else {}
        props = ((f.get("parameters") or {}).get("properties") or {}) if isinstance(f, dict) else {}
        out[f.get("name", "")] = {k: (v.get("type") if isinstance(v, dict) else None) for k, v in props.items()}
    return out


def _escaped(text: str) -> str:
    """Text as the inside of a JSON string; pieces escaped one by one concatenate to the whole's escape."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


class OutputParser(OutputParserBase):
    # states: reasoning | content | block (between calls) | call (in an invoke) | param (in a value) | after
    def __init__(self, *, thinking: bool, tools: list | None, new_id=None, whole_calls: bool = False) -> None:
        super().__init__(thinking=thinking, tools=tools, new_id=new_id, whole_calls=whole_calls)
        self.types = _param_types(tools)
        self._streams = False      # the open parameter streams as a JSON string

    def finish(self) -> list[Event]:
        events = self._run(final=True)
        if self.state in ("block", "call", "param"):
            self._cut_off()
        elif self.pos < len(self.buf):
            rest = self.buf[self.pos:]
            if self.state == "content" and self.tools_on and held_suffix(rest, TOOL_CALLS_OPEN) > 1:
                # cut off inside the block's opener `<｜DSML｜tool_ca`: the format's text, not content
                rest = rest[: len(rest) - held_suffix(rest, TOOL_CALLS_OPEN)].rstrip()
            events += self._emit("reasoning" if self.state == "reasoning" else "content", rest)
        self.buf, self.pos = "", 0
        return events

    def _reasoning(self, final: bool) -> list[Event]:
        i = self._find(END_THINK)
        if i >= 0:
            out = self._emit("reasoning", self.buf[self.pos:i])
            self.pos = i + len(END_THINK)
            self.state = "content"
            return out
        end = len(self.buf) - (0 if final else held_suffix(self.buf, END_THINK, self.pos))
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
        end = len(self.buf) - held_suffix(self.buf, TOOL_CALLS_OPEN, self.pos)
        body = self.buf[self.pos:end]
        end -= len(body) - len(body.rstrip())       # whitespace may precede a block: hold it too
        out = self._emit("content", self.buf[self.pos:end])
        self.pos = end
        return out

    def _block(self, final: bool) -> list[Event]:
        m = self._match(_INVOKE_RE)
        if m:
            return self._open_call(m.group(1), m.end())
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
            out = self._close_call(m.end())
            self.state = "block"
            return out
        return self._undecided((_PARAM_OPEN, INVOKE_CLOSE), final)

    def _param(self, final: bool) -> list[Event]:
        i = self._find(PARAM_CLOSE)
        end = i if i >= 0 else len(self.buf) - (0 if final else held_suffix(self.buf, PARAM_CLOSE, self.pos))
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

    def _undecided(self, openers: tuple[str, ...], final: bool) -> list[Event]:
        rest = self.buf[self.pos:self.pos + MAX_TAG].lstrip()
        if not rest:
            return []
        could_be = any(o.startswith(rest) or (rest.startswith(o) and '">' not in rest) for o in openers)
        if could_be and len(self.buf) - self.pos < MAX_TAG:
            return []        # still could become what is expected: wait for more text (or cut off: finish)
        return self._malformed(f"expected one of {', '.join(openers)} at {rest[:40]!r}")

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
