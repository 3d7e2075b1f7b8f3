"""What every family's output parser shares: the buffer, the state loop, and what happens to a call.

A family's parser (daemon/protocol/<family>/output.py) reads its model's reasoning markers and tool-call
format; this base holds the machinery all of them run the same way, so the contract its module notes
state is one implementation: one `feed`/`finish` path for the streamed and the whole reply, a buffer
scanned once (a position instead of slices; `scanned` counts what the scans examined), the block's raw
text kept until its call closes (a malformed block becomes content, an open call is dropped), a call cut
off by the end of the output dropped, and `whole_calls` holding a call's events until it is whole.

A subclass sets the states it reads as `_<state>(final)` methods (the loop calls the one named by
`self.state` until nothing moves; "after" is shared: the rest is content), its `finish`, and its
`_undecided` (what to say of text that is not the tag expected).
"""

from __future__ import annotations

import re
import secrets

from .events import Event, Parsed, ToolCall

# A tag still open after this many characters is not one (a name is an identifier): malformed,
# which also keeps a tag that never closes from being re-matched on every feed.
MAX_TAG = 1024


def held_suffix(buf: str, marker: str, start: int = 0) -> int:
    """Length of the longest suffix of buf[start:] that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(buf) - start), 0, -1):
        if buf.endswith(marker[:n]):
            return n
    return 0


class OutputParserBase:
    def __init__(self, *, thinking: bool, tools: list | None, new_id=None, whole_calls: bool = False) -> None:
        self.state = "reasoning" if thinking else "content"
        self.buf = ""
        self.pos = 0               # buf[:pos] is decided; feed drops it before appending
        self.scanned = 0           # characters the scans examined (a test holds this linear)
        self.tools_on = bool(tools)
        self.new_id = new_id or (lambda: "call_" + secrets.token_hex(12))
        self.whole_calls = whole_calls
        self.result = Parsed()
        self._raw: list[str] = []  # block text since its start or the last closed call (if malformed)
        self._open: ToolCall | None = None
        self._n_params = 0
        self._key = ""             # the open parameter's name and its value's pieces
        self._pieces: list[str] = []
        self._start: Event | None = None   # whole_calls: the open call's tool_start, emitted when it closes

    def feed(self, text: str) -> list[Event]:
        if self.pos:
            self.buf = self.buf[self.pos:]
            self.pos = 0
        self.buf += text
        return self._run(final=False)

    # --- machinery ---------------------------------------------------------------------------

    def _emit(self, kind: str, text: str) -> list[Event]:
        """kind: "reasoning" or "content"."""
        if not text:
            return []
        (self.result._reasoning if kind == "reasoning" else self.result._content).add(text)
        return [Event(kind, text)]

    def _find(self, marker: str) -> int:
        i = self.buf.find(marker, self.pos)
        self.scanned += (len(self.buf) if i < 0 else i + len(marker)) - self.pos
        return i

    def _match(self, pattern: re.Pattern):
        m = pattern.match(self.buf, self.pos)
        self.scanned += (m.end() - self.pos) if m else min(len(self.buf) - self.pos, MAX_TAG)
        return m

    def _take(self, end: int) -> str:
        """Consume buf[pos:end] inside a block (kept raw in case the block turns out malformed)."""
        text = self.buf[self.pos:end]
        self._raw.append(text)
        self.pos = end
        return text

    def _run(self, final: bool) -> list[Event]:
        events: list[Event] = []
        while True:
            before = (self.state, self.pos)
            if self.state == "after":     # after a malformed block (or V4's one block): the rest is content
                events += self._emit("content", self.buf[self.pos:])
                self.pos = len(self.buf)
            else:
                events += getattr(self, "_" + self.state)(final)
            if (self.state, self.pos) == before:
                return events

    def _open_call(self, name: str, end: int) -> list[Event]:
        """A call's opening tag, up to buf[end], was read: the call starts (its tool_start, or held)."""
        call = ToolCall(self.new_id(), name)
        self.result.tool_calls.append(call)
        self._open, self._n_params = call, 0
        self._take(end)
        self.state = "call"
        start = Event("tool_start", index=len(self.result.tool_calls) - 1, id=call.id, name=call.name)
        if self.whole_calls:
            self._start = start
            return []
        return [start]

    def _close_call(self, end: int) -> list[Event]:
        """The open call's closing tag, up to buf[end], was read: its arguments end; with whole_calls
        it is emitted now, whole."""
        self._take(end)
        out = self._args("{}" if self._n_params == 0 else "}")
        if self.whole_calls:
            out = [self._start, Event("tool_args", self._open.arguments, index=self._start.index)]
            self._start = None
        self._open, self._raw = None, []
        return out

    def _args(self, frag: str) -> list[Event]:
        self._open._arguments.add(frag)
        if self.whole_calls:
            return []
        return [Event("tool_args", frag, index=len(self.result.tool_calls) - 1)]

    def _cut_off(self) -> None:
        """The output ended inside a block: calls already closed stay; an open call is dropped, not
        closed, and none of the block's raw text becomes content."""
        if self._open is not None:
            self._drop_open("cut_off")
            self.result.warnings.append("a tool call was cut off by the end of the output; it was dropped")
        self.state = "after"

    def _drop_open(self, why: str) -> None:
        self.result.tool_calls.remove(self._open)
        self._open, self._start = None, None
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
