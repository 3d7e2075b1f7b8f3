"""Give freed heap back to the OS when the engine goes idle.

Design notes: under load glibc's malloc keeps the memory that request bodies, JSON parsing, replies
and snapshots freed in its arenas (one per thread that allocated); the soak measured it as a plateau
of ~+16 % RSS after the load that never came back by itself (docs/operations.md, "Memory"). It is
reusable by the next request, but an idle daemon that keeps it looks like a leak and holds cgroup
memory another process could use. `malloc_trim(0)` returns the free pages of every arena.

When: once per idle period, after `quiet_s` with no request admitted or waiting — never per request
(a trim walks every arena under its locks, milliseconds at this size) — and in a worker thread, so
the Trio loop never waits on it. Linux with glibc only; elsewhere `malloc_trim` is None and nothing
runs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from typing import Callable

import trio

QUIET_S = 2.0      # idle this long before a trim: a client's next turn usually comes sooner


def _glibc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.malloc_trim          # glibc only (musl has none)
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


_TRIM = _glibc_trim()


def rss_bytes() -> int:
    """This process's resident set (/proc/self/statm); 0 where there is none."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def malloc_trim() -> int | None:
    """glibc `malloc_trim(0)`: the bytes of RSS it gave back (RSS before less after, at least 0), or
    None where it does not exist. Blocking: call it from a worker thread."""
    if _TRIM is None:
        return None
    before = rss_bytes()
    _TRIM(0)
    return max(0, before - rss_bytes())


class IdleTrim:
    """Trims once each time the engine has been idle for `quiet_s`. Admission reports `note(busy)`
    after every message it handles (busy: a request admitted or waiting); `run` is the task that waits
    and trims. `trim` and `in_thread` are injected (tests); no glibc makes `run` return at once."""

    def __init__(self, log, quiet_s: float = QUIET_S, trim: Callable[[], int | None] = malloc_trim,
                 in_thread=trio.to_thread.run_sync) -> None:
        if quiet_s < 0:
            raise ValueError(f"quiet_s: must be 0 or more seconds, got {quiet_s}")
        self.log, self.quiet_s = log, quiet_s
        self.trim = None if trim is malloc_trim and _TRIM is None else trim
        self.in_thread = in_thread
        self.busy = False
        self.worked = False                # a request was admitted since the last trim
        self.trims = 0
        self._changed = trio.Event()

    def note(self, busy: bool) -> None:
        """Sync, from admission's loop: whether a request is admitted or waiting now."""
        self.worked = self.worked or busy
        if busy != self.busy:
            self.busy = busy
            self._changed.set()
            self._changed = trio.Event()

    async def _until(self, cond: Callable[[], bool]) -> None:
        while not cond():
            await self._changed.wait()

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        if self.trim is None:
            return
        while True:
            # idle after some work (a fresh daemon, or one trimmed since, has nothing to give back)
            await self._until(lambda: self.worked and not self.busy)
            with trio.move_on_after(self.quiet_s):
                await self._until(lambda: self.busy)
                continue                   # busy again before the quiet period ended
            self.worked = False
            returned = await self.in_thread(self.trim)
            self.trims += 1
            self.log.debug("malloc_trim", returned_bytes=returned, rss_bytes=rss_bytes())
