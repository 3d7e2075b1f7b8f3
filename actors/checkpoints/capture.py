"""Checkpoints, the capture side: store a snapshot taken at a capture point, refuse (before it is
taken) one the store could not keep, make room for a growing live state, and queue the disk write.

Memory: a snapshot queued for the writer is held in the store's memory budget until written
(``store.hold``); a capture whose write would break the budget is not written. Recency of disk
entries (hits, shared prompts) goes to the writer as ``FlushRecency`` (at most one queued), which
saves it as file mtimes, so the disk tier's LRU order survives a restart. Every eviction is applied
here (``_apply``: its log line and metric), whichever part caused it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import trio

from ..engine.messages import FlushRecency, WriteCheckpoint
from .disk_format import KINDS as DISK_KINDS, file_name, prefix_hash
from .store import Entry, Eviction, Footprint, footprint

METRIC_TIER = {"memory": "ram", "disk": "disk"}   # the metric label values (daemon/service/metrics.py)


class Capture:
    """Capturing and the memory tier's bookkeeping. Uses the attributes set in
    ``Checkpoints.__init__``: enabled, share_pages, store, out, disk_enabled, write_backoff,
    captures_skipped, _no_write, _recency, _flush_queued, log, metrics. Calls no other part."""

    def capture(self, tokens: np.ndarray, kind: str, snapshot: Any, request_id: str) -> None:
        """Store a snapshot taken at ``tokens`` (in memory; queue the disk write when on)."""
        eid = prefix_hash(tokens)
        before = self.store.memory_usage()
        evictions = self.store.put(tokens, kind, snapshot)
        e = self.store.get(eid)
        kept = e is not None and e.in_memory
        if self.log is not None:
            own, shared = self.store.breakdown(e) if kept else (0, 0)
            self.log.info("checkpoint_store", request_id=request_id, id=eid, kind=kind,
                          tokens=int(tokens.shape[0]), bytes=footprint(snapshot).nbytes,
                          copied_bytes=int(getattr(snapshot, "copied_nbytes", 0)), own_bytes=own,
                          shared_bytes=shared, added_bytes=max(0, self.store.memory_usage() - before),
                          tier="memory", kept=kept)
        self._apply(evictions)
        self._update_bytes()
        if (self.disk_enabled and self.out is not None and not (e is not None and e.on_disk)
                and kind in DISK_KINDS   # a reply_end serves this process's reply table only: memory
                and self.write_backoff.allows(trio.current_time())):   # paused after a failed write: memory only
            self._queue_write(eid, tokens, kind, snapshot)

    def capture_bytes(self, state) -> int:
        """What a snapshot of ``state`` would add to the memory tier: its tail, plus its page groups
        the tier does not hold yet (all of them when pages are not shared)."""
        pages = [int(p) for p in state.page_ids]
        held = self.store.memory_pages() if self.share_pages else set()
        return int(state.tail_nbytes) + int(state.page_nbytes) * sum(1 for p in pages if p not in held)

    def capture_refusal(self, nbytes: int, figures=None, kind: str = "prompt_end") -> str | None:
        """Why a snapshot adding ``nbytes`` would not be kept by the store (None: it could be):
        checked before the snapshot is taken, so a capture that could not be kept is never copied.
        ``figures`` (sequence.StateFigures of the state): also refused when the store would drop it at
        once, not fitting beside the protected checkpoint and the snapshots queued for the writer."""
        if not self.enabled or self.store.max_slots == 0:
            return "checkpoints off"
        if nbytes > self.store.max_bytes:
            return (f"snapshot of {nbytes} bytes is larger than the checkpoint memory budget "
                    f"({self.store.max_bytes} bytes)")
        if figures is not None:
            if self.share_pages:
                fp = Footprint(figures.tail_nbytes, tuple(figures.page_ids), figures.page_nbytes)
            else:
                fp = Footprint(figures.tail_nbytes + len(figures.page_ids) * figures.page_nbytes)
            if not self.store.would_keep(fp, kind, figures.n_tokens):
                return (f"snapshot of {fp.nbytes} bytes would not fit the checkpoint memory budget "
                        f"({self.store.max_bytes} bytes) beside the protected checkpoint and those queued for "
                        "the disk writer")
        return None

    def skip_capture(self, tokens: np.ndarray, kind: str, nbytes: int, reason: str, request_id: str) -> None:
        self.captures_skipped += 1
        if self.log is not None:
            self.log.info("checkpoint_capture_skipped", request_id=request_id, kind=kind,
                          tokens=int(tokens.shape[0]), bytes=nbytes, reason=reason)
        if self.metrics is not None:
            self.metrics.checkpoint_captures_skipped.inc(
                reason="transient_room" if "capture's copy" in reason else "budget")

    def make_room(self, nbytes: int, request_id: str = "", keep_pages=frozenset(), spare=()) -> int:
        """Evict checkpoints from memory until ``nbytes`` are freed or none is left to evict (the
        memory guard, for a growing live state). Disk copies stay. ``keep_pages``: the live states'
        page groups (evicting frees none of them); ``spare``: ids to keep (the one being restored).
        Returns the bytes freed, those groups not counted."""
        before = self.store.memory_usage_beside(keep_pages)
        evictions = self._apply(self.store.evict_memory(nbytes, keep_pages, spare))
        freed = before - self.store.memory_usage_beside(keep_pages)
        if evictions and self.log is not None:
            self.log.info("checkpoint_evict_for_state", request_id=request_id, evicted=len(evictions),
                          bytes_freed=freed, bytes_wanted=nbytes)
        self._update_bytes()
        return freed

    def _queue_write(self, eid: str, tokens: np.ndarray, kind: str, snapshot: Any) -> None:
        if self.store.is_held(eid):       # already queued: the same tokens give the same snapshot
            self._no_write.discard(eid)   # captured again after a delete: write it after all
            return
        reason = None
        if not self.store.can_hold(eid, snapshot):
            reason = "memory budget (snapshots waiting for the writer count against it)"
        else:
            try:
                self.out.send_nowait(WriteCheckpoint(eid, tokens, kind, snapshot))
                self.store.hold(eid, snapshot)
            except trio.WouldBlock:
                reason = "writer busy (queue full)"
        if reason is not None and self.log is not None:
            self.log.warning("checkpoint_write_dropped", id=eid, tokens=int(tokens.shape[0]), reason=reason)

    def _note_recency(self, entries: list[Entry]) -> None:
        """Disk entries just used: their new recency goes to the files' mtimes (by the writer)."""
        if not self.disk_enabled or self.out is None:
            return
        for e in entries:
            if e.on_disk:
                self._recency[file_name(e.tokens)] = float(e.last_used)
        if self._recency and not self._flush_queued:
            try:
                self.out.send_nowait(FlushRecency())
                self._flush_queued = True
            except trio.WouldBlock:
                pass   # saved with the next flush or write

    def _apply(self, evictions: list[Eviction]) -> list[Eviction]:
        for ev in evictions:
            if self.log is not None:
                self.log.info("checkpoint_evict", id=ev.entry.id, kind=ev.entry.kind, tokens=ev.entry.n_tokens,
                              tier=ev.tier, dropped=ev.dropped,
                              bytes=ev.entry.nbytes if ev.tier == "memory" else ev.entry.disk_nbytes,
                              pages_freed=len(ev.pages_freed))
            if self.metrics is not None:
                self.metrics.checkpoint_evictions.inc(tier=METRIC_TIER[ev.tier])
        return evictions

    def _update_bytes(self) -> None:
        if self.metrics is None:
            return
        st = self.store.stats()
        self.metrics.checkpoint_bytes.set(st.memory_bytes, tier="ram")
        if self.disk_enabled or st.disk_entries:
            self.metrics.checkpoint_bytes.set(st.disk_bytes, tier="disk")
