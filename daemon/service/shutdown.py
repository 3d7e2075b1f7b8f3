"""A bound on shutdown: after SIGTERM or SIGINT the daemon has `shutdown_timeout_s` to stop.

Why: a stop cancels every task, and each one ends at its next checkpoint (a kernel call at its next
chunk). A wait that never ends (a shielded wait whose other side is gone, a kernel call that does
not return) would otherwise hold the process for good: systemd ends that with SIGKILL after
TimeoutStopSec, a daemon started by hand waits forever. The deadline runs in a thread of its own, so
a blocked event loop cannot stop it: it logs `shutdown_timeout`, writes every thread's stack to
stderr (what was stuck) and exits 1 without waiting for anything else.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
from typing import Callable


class ShutdownDeadline:
    def __init__(self, seconds: float, log, *, exit: Callable[[int], None] = os._exit,
                 dump: Callable[[], None] = lambda: faulthandler.dump_traceback(sys.stderr, all_threads=True)) -> None:
        if seconds <= 0:
            raise ValueError(f"seconds: must be more than 0, got {seconds}")
        self.seconds, self.log, self._exit, self._dump = seconds, log, exit, dump
        self._timer: threading.Timer | None = None
        self.expired = False

    def start(self) -> None:
        """From the signal handler task, once: the clock starts."""
        if self._timer is None:
            self._timer = threading.Timer(self.seconds, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def cancel(self) -> None:
        """The daemon stopped in time (or never started stopping)."""
        if self._timer is not None:
            self._timer.cancel()

    def _expire(self) -> None:
        self.expired = True
        self.log.error("shutdown_timeout", seconds=self.seconds,
                       reason="tasks still running after the stop signal; their stacks follow on stderr")
        try:
            self._dump()
        finally:
            self._exit(1)
