"""Pure stop-string matching over streamed text.

Text that could still turn out to be the start of a stop string is held back; once a stop string
appears, the text before it is released and the rest is dropped.
"""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.matched: str | None = None    # the stop string that ended the text (the earliest in it)

    def push(self, text: str, control: str | None = None) -> tuple[str, bool]:
        """Add streamed text. Returns (text safe to emit now, stopped). `control`: the text of a control
        token the reply drops (daemon/protocol/tokenizer.StreamDecoder); a stop string that is exactly
        that text still stops there (a client may stop on `<｜User｜>`)."""
        if control is not None and control in self._stops:
            out, self._held = self._held + text, ""
            self.matched = control
            return out, True
        if not self._stops:
            return text, False
        buf = self._held + text
        hits = [(i, s) for i, s in ((buf.find(s), s) for s in self._stops) if i >= 0]
        if hits:
            self._held = ""
            at, self.matched = min(hits, key=lambda h: h[0])
            return buf[:at], True
        keep = 0
        for s in self._stops:                 # longest suffix of buf that is a proper prefix of s
            for n in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:n]):
                    keep = n
                    break
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        out, self._held = self._held, ""
        return out
