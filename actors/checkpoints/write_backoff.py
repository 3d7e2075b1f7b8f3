"""When the disk tier may try a write again after one failed. Pure: no I/O, the clock is passed in.

A failed write (full disk, read-only remount, quota) pauses disk writes for ``first_s``; each
failure while paused doubles the pause up to ``max_s``; the first successful write ends it. The
caller logs the two state changes (paused, resumed) and nothing per failed attempt, so a disk that
stays full costs one write attempt per pause and one log line.
"""

from __future__ import annotations

from dataclasses import dataclass

FIRST_S = 1.0
MAX_S = 300.0


@dataclass
class WriteBackoff:
    first_s: float = FIRST_S
    max_s: float = MAX_S
    delay_s: float = 0.0            # the current pause; 0 when writes are not paused
    retry_at: float = float("-inf")

    @property
    def paused(self) -> bool:
        return self.delay_s > 0

    def allows(self, now: float) -> bool:
        """A write may be attempted at ``now`` (not paused, or the pause is over: one retry)."""
        return now >= self.retry_at

    def failed(self, now: float) -> bool:
        """Record a failed write; True when this starts a pause (the caller logs it once)."""
        starts = not self.paused
        self.delay_s = self.first_s if starts else min(self.delay_s * 2, self.max_s)
        self.retry_at = now + self.delay_s
        return starts

    def succeeded(self) -> bool:
        """Record a successful write; True when this ends a pause (the caller logs it once)."""
        ended = self.paused
        self.delay_s, self.retry_at = 0.0, float("-inf")
        return ended
