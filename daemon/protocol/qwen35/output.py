"""What Qwen3.5 writes -> OpenAI message parts: reasoning, content, tool calls. Pure, incremental.

The same contract as V4's parser (daemon/protocol/dsv4/output.py): one `feed`/`finish` path for the
streamed and the whole reply, the same `Event` stream and `Parsed` result, so the responders and
reply_end read either family alike.

- Thinking mode: the prompt ends with `<think>\\n`; text up to `</think>` is reasoning. The template
  writes a past turn as `<think>\\n` + reasoning + `\\n</think>\\n\\n` + content, so whitespace right
  before `</think>` and right after it belongs to the format, not to the reasoning or the content.
- With tools offered, each call is its own block after the content:
  `<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n…</function>\\n</tool_call>`.
  Whitespace before a block, and between or after blocks, belongs to the format.
- Values are raw text up to `\\n</parameter>` (a value cannot contain it). They are typed by the
  tool's JSON schema: a string parameter is the text as is; anything else is read as JSON, or as the
  Python literals the template's `|string` writes (`True`, `False`, `None`); text that reads as
  neither stays a string. A parameter of an unknown tool or property is typed the same way with no
  schema (JSON if it parses).
- A call's arguments are an object; each parameter is one `tool_args` fragment when its value is
  complete (`{"p": "v"`, `, "q": 10`), and the function's end adds `}`. `whole_calls=True` (the
  responders): the call's `tool_start` and all of its arguments come as two events at `</function>`.
- Streaming lookahead: text that could still be the start of a marker (`</think>`, `<tool_call>`,
  `\\n</parameter>`, whitespace the format may own) is held back until it is decided, so no split
  of the text into chunks changes the result, and no partial marker reaches the content.
- A call cut off by the end of the output is dropped (`dropped_call`, "cut_off"). A malformed block
  is not lost: its raw text becomes content, an open call is dropped, and `warnings` says why.
- A call may name a function the request did not offer: it is returned as the model wrote it (as
  V4's parser does); the API layer decides what to do with it.
"""

from __future__ import annotations

import json
import re

from ..events import Event, Parsed
from ..output_parser import MAX_TAG, OutputParserBase, held_suffix
from .markers import END_THINK, FUNCTION_CLOSE, FUNCTION_OPEN, PARAM_CLOSE, PARAM_OPEN, TOOL_CALL, TOOL_CALL_CLOSE

_FUNCTION_RE = re.compile(r"\s*<function=([^>\n]*)>")
_PARAM_RE = re.compile(r"\s*<parameter=([^>\n]*)>(\n?)")
_FUNCTION_END_RE = re.compile(rf"\s*{re.escape(FUNCTION_CLOSE)}")
_CALL_END_RE = re.compile(rf"\s*{re.escape(TOOL_CALL_CLOSE)}")
_PY_LITERALS = {"True": True, "False": False, "None": None}
_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object",
               type(None): "null"}


def _trailing_space(buf: str, start: int, end: int) -> int:
    n = end
    while n > start and buf[n - 1].isspace():
        n -= 1
    return end - n


def param_types(tools: list | None) -> dict[str, dict[str, frozenset[str]]]:
    """function name -> property -> the JSON types its schema allows (empty: not said)."""
    out: dict[str, dict[str, frozenset[str]]] = {}
    for t in tools or []:
        f = t.get("function", t) if isinstance(t, dict) else {}
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            continue
        props = (f.get("parameters") or {}).get("properties") or {}
        types = {}
        for k, sub in props.items() if isinstance(props, dict) else ():
            want = sub.get("type") if isinstance(sub, dict) else None
            if isinstance(sub, dict) and want is None and isinstance(sub.get("enum"), list) and sub["enum"] \
                    and all(isinstance(v, str) for v in sub["enum"]):
                want = "string"
            types[k] = frozenset([want] if isinstance(want, str) else
                                 [w for w in want if isinstance(w, str)] if isinstance(want, list) else [])
        out[f["name"]] = types
    return out


def typed_value(raw: str, types: frozenset[str]):
    """A parameter's text -> its value, by the types its schema allows (see the module notes)."""
    if types and types <= {"string"}:
        return raw
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):     # RecursionError: thousands of `[`
        if raw.strip() not in _PY_LITERALS:
            return raw
        value = _PY_LITERALS[raw.strip()]
    if isinstance(value, float) and value != value or value in (float("inf"), float("-inf")):
        return raw           # NaN / Infinity: JSON has no such number
    kind = _JSON_TYPES.get(type(value))
    fits = not types or kind in types or (kind == "integer" and "number" in types)
    if fits or "string" not in types:
        return value
    return raw


class OutputParser(OutputParserBase):
    # states: reasoning | content | block (after <tool_call>) | call (in a function) | param (in a value)
    # | fn_end (after </function>) | after (a malformed block: the rest is content)
    def __init__(self, *, thinking: bool, tools: list | None, new_id=None, whole_calls: bool = False) -> None:
        super().__init__(thinking=thinking, tools=tools, new_id=new_id, whole_calls=whole_calls)
        self.types = param_types(tools)
        self._lstrip = False       # leading whitespace of the coming content is the format's

    def finish(self) -> list[Event]:
        events = self._run(final=True)
        if self.state in ("block", "call", "param"):
            self._cut_off()
        elif self.state in ("reasoning", "content") and self.pos < len(self.buf):
            events += self._emit(self.state, self.buf[self.pos:])
        self.buf, self.pos = "", 0
        return events

    def _reasoning(self, final: bool) -> list[Event]:
        i = self._find(END_THINK)
        if i >= 0:
            end = i - _trailing_space(self.buf, self.pos, i)      # "\n</think>": the format's newline
            out = self._emit("reasoning", self.buf[self.pos:end])
            self.pos = i + len(END_THINK)
            self.state, self._lstrip = "content", True
            return out
        if final:
            return []            # finish() emits the rest, held whitespace included
        end = len(self.buf) - held_suffix(self.buf, END_THINK, self.pos)
        end -= _trailing_space(self.buf, self.pos, end)
        out = self._emit("reasoning", self.buf[self.pos:end])
        self.pos = end
        return out

    def _content(self, final: bool) -> list[Event]:
        if self._lstrip:
            while self.pos < len(self.buf) and self.buf[self.pos].isspace():
                self.pos += 1
            if self.pos == len(self.buf):
                return []
            self._lstrip = False
        if not self.tools_on:            # no tools offered: call markup is just text
            out = self._emit("content", self.buf[self.pos:])
            self.pos = len(self.buf)
            return out
        i = self._find(TOOL_CALL)
        if i >= 0:
            end = i - _trailing_space(self.buf, self.pos, i)
            out = self._emit("content", self.buf[self.pos:end])
            self._raw = [self.buf[end:i + len(TOOL_CALL)]]   # kept in case the block is malformed
            self.pos = i + len(TOOL_CALL)
            self.state = "block"
            return out
        if final:
            return []            # finish() emits the rest
        end = len(self.buf) - held_suffix(self.buf, TOOL_CALL, self.pos)
        end -= _trailing_space(self.buf, self.pos, end)     # whitespace may precede a block: hold it
        out = self._emit("content", self.buf[self.pos:end])
        self.pos = end
        return out

    def _block(self, final: bool) -> list[Event]:
        m = self._match(_FUNCTION_RE)
        if m:
            return self._open_call(m.group(1), m.end())
        return self._undecided((FUNCTION_OPEN,), final)

    def _call(self, final: bool) -> list[Event]:
        m = self._match(_PARAM_RE)
        if m:
            if not m.group(2) and m.end() == len(self.buf) and not final:
                return []        # the value's leading newline (the format's) may still come
            self._take(m.end())
            self._key, self._pieces = m.group(1), []
            self.state = "param"
            return []
        m = self._match(_FUNCTION_END_RE)
        if m:
            out = self._close_call(m.end())
            self.state = "fn_end"
            return out
        return self._undecided((PARAM_OPEN, FUNCTION_CLOSE), final)

    def _param(self, final: bool) -> list[Event]:
        i = self._find(PARAM_CLOSE)
        end = i if i >= 0 else len(self.buf) - (0 if final else held_suffix(self.buf, PARAM_CLOSE, self.pos))
        self._pieces.append(self._take(end))
        if i < 0:
            return []
        self._take(i + len(PARAM_CLOSE))
        self.state = "call"
        want = self.types.get(self._open.name, {}).get(self._key, frozenset())
        value = typed_value("".join(self._pieces), want)
        frag = ("{" if self._n_params == 0 else ", ") + json.dumps(self._key, ensure_ascii=False) + ": " \
            + json.dumps(value, ensure_ascii=False)
        self._n_params += 1
        return self._args(frag)

    def _fn_end(self, final: bool) -> list[Event]:
        m = self._match(_CALL_END_RE)
        if m:
            self.pos = m.end()
            self._raw = []
            self.state, self._lstrip = "content", True
            return []
        if final and not self.buf[self.pos:].strip():
            return []            # the output ended after a whole call, before `</tool_call>`: it stands
        return self._undecided((TOOL_CALL_CLOSE,), final)

    def _undecided(self, openers: tuple[str, ...], final: bool) -> list[Event]:
        rest = self.buf[self.pos:self.pos + MAX_TAG].lstrip()
        if not rest:
            return []
        could_be = any(o.startswith(rest) or (rest.startswith(o) and ">" not in rest[len(o):]) for o in openers)
        if could_be and len(self.buf) - self.pos < MAX_TAG:
            return []        # still could become what is expected: wait for more text (or cut off: finish)
        where = f"in function {self._open.name!r}" if self._open is not None else f"after {self._state_marker()}"
        return self._malformed(f"expected {' or '.join(openers)} {where}")

    def _state_marker(self) -> str:
        return TOOL_CALL if self.state == "block" else FUNCTION_CLOSE


def parse_all(text: str, *, thinking: bool, tools: list | None) -> Parsed:
    p = OutputParser(thinking=thinking, tools=tools)
    p.feed(text)
    p.finish()
    return p.result
