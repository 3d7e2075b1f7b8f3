"""Prefix checkpoints, the effect side: the store (pure, store.py) plus logs, metrics and files.

Design notes
 * Everything here runs on the Trio thread (the prefill worker, the checkpoint writer, the HTTP
   edge), so the store needs no lock. Blocking file work (read a payload, write, delete) goes to a
   worker thread; snapshots and restores go to the kernel thread (the caller's job).
 * Policy stays in plan.py / store.py; this class only applies it and reports it: one structured
   log line per store, hit, miss (with its reason) and eviction, and the matching metrics.
 * One class, composed of a mixin per job, each in its own module: restore.py (plan, fetch and check
   a snapshot), capture.py (store one, make room, queue its write), disk_tier.py (the local disk tier
   and the writer's jobs), shared_tier.py (a directory shared by several daemons), views.py (the
   operator's listing, delete and stats). The state they share is set here, in ``__init__``; each
   mixin's docstring names the attributes it uses.
 * Entry ids are the store's ids (blake2b-64 of the token ids, 16 hex digits), also the file stems.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import trio

from . import disk_io
from .capture import Capture
from .disk_tier import DiskTier
from .restore import Restore
from .shared_tier import SHARED_LIST_TIMEOUT_S, SHARED_LOAD_TIMEOUT_S, SharedTier
from .store import CheckpointStore
from .views import OperatorViews
from .write_backoff import WriteBackoff


class _MonotonicWallClock:
    """Unix time, but strictly increasing, so LRU order never ties (the API shows it as last_used)."""

    def __init__(self) -> None:
        self._last = 0.0

    def __call__(self) -> float:
        self._last = max(time.time(), self._last + 1e-6)
        return self._last


class Checkpoints(Restore, Capture, DiskTier, SharedTier, OperatorViews):
    """The engine's checkpoints (``engine.checkpoints``): the store and its effects, one part per job."""

    def __init__(self, *, enabled: bool = True, max_slots: int = 4, max_bytes: int = 1 << 30,
                 min_tokens: int = 512, tail_guard: int = 8, fingerprint: str = "",
                 disk_dir: str | Path | None = None, disk_max_bytes: int = 0, shared: bool = False,
                 shared_list_timeout_s: float | None = None, shared_load_timeout_s: float | None = None,
                 rebuild=None, share_pages: bool = True, log=None, metrics=None) -> None:
        self.enabled = enabled
        self.min_tokens = min_tokens
        self.tail_guard = tail_guard
        self.fingerprint = fingerprint
        # (tail, pages) -> kernel Snapshot, for a checkpoint read from disk (run in the reading thread)
        self.rebuild = rebuild
        self.share_pages = share_pages     # False: every capture copies its page groups (a whole state)
        self.disk_root = Path(disk_dir) if disk_dir is not None else None   # shared by every model
        self.disk_dir: Path | None = None  # this model's subdirectory, set by open_disk()
        self._lock: disk_io.DirLock | None = None
        self._disk_max_bytes = disk_max_bytes
        self.shared = shared               # the disk tier is shared with other daemons (shared_dir.py)
        self._dir_mtime: int | None = None # the shared directory's mtime at the last refresh
        self._listed_at = float("-inf")    # trio time of the last listing
        self._left_alone: set[str] = set() # shared files refused but not removed (foreign, unreadable): warned once
        self._refreshing = False
        self.shared_list_timeout_s = SHARED_LIST_TIMEOUT_S if shared_list_timeout_s is None else shared_list_timeout_s
        self.shared_load_timeout_s = SHARED_LOAD_TIMEOUT_S if shared_load_timeout_s is None else shared_load_timeout_s
        self._hung: threading.Event | None = None   # set when the shared call that ran past its deadline returns
        self._refresh_wanted = trio.Event()         # poked before each plan; refresh_loop lists in the background
        self._refresh_done = trio.Event()           # set (and replaced) each time refresh_loop finishes one
        self._refreshes = 0                         # refreshes refresh_loop has finished
        self._loop_running = False
        self.disk_enabled = False          # set by open_disk() when the directory is usable
        self.store = CheckpointStore(max_slots=max_slots if enabled else 0, max_bytes=max_bytes,
                                     disk_max_bytes=0, clock=_MonotonicWallClock())
        self.previous_fresh_prompt: np.ndarray | None = None
        self.log = log
        self.metrics = metrics
        self.out: trio.MemorySendChannel | None = None      # to the checkpoint writer (wiring.py)
        self._disk_warned = False
        self.write_backoff = WriteBackoff()   # a failed write pauses disk writes for a while (write_backoff.py)
        self._no_write: set[str] = set()   # deleted through the API while its write was queued (held)
        self._recency: dict[str, float] = {}   # file name -> last use not yet saved as its mtime
        self._flush_queued = False
        self.captures_skipped = 0          # captures not taken: the snapshot could not have been kept
