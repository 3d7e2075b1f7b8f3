"""Prefill progress for the client: a `Progress` reply at the start of a prefill and at segment boundaries.

Best effort and never blocking: sent with `reply_nowait` (a full or closed reply channel drops it),
throttled to at most one every `MIN_INTERVAL_S` (the first always goes out). The HTTP edge turns it
into an SSE comment line (`: progress {...}`) on streamed responses and into `/v1/status`.
"""

from __future__ import annotations

import trio

from .messages import Progress
from .replies import reply_nowait

MIN_INTERVAL_S = 0.25          # <= 4 progress messages per second per request


class ProgressReporter:
    """One per prefill. `total` = prompt tokens; `reused` = tokens not computed (the starting point)."""

    def __init__(self, submit, total: int, reused: int, *, min_interval_s: float = MIN_INTERVAL_S) -> None:
        self.submit, self.total, self.reused = submit, total, reused
        self.min_interval_s = min_interval_s
        self.t_begin = trio.current_time()
        self._last_sent: float | None = None

    def begin(self) -> None:
        """Before the first segment: tells the client the total at once."""
        self._send(self.reused, None, trio.current_time())

    def segment_done(self, done: int) -> None:
        """After a segment; `done` counts prompt tokens now in the state (reused included)."""
        now = trio.current_time()
        if self._last_sent is not None and now - self._last_sent < self.min_interval_s:
            return
        computed = done - self.reused
        elapsed = now - self.t_begin
        eta = None
        if computed > 0 and elapsed > 0:
            eta = round((self.total - done) * elapsed / computed, 2)
        self._send(done, eta, now)

    def _send(self, done: int, eta: float | None, now: float) -> None:
        self._last_sent = now
        reply_nowait(self.submit, Progress(self.submit.request_id, int(done), int(self.total), eta))
