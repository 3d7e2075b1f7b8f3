"""Prefix checkpoints, the effect side: the store (pure, store.py) plus logs, metrics and files.

Design notes
 * Everything here runs on the Trio thread (the prefill worker, the checkpoint writer, the HTTP
   edge), so the store needs no lock. Blocking file work (read a payload, write, delete) goes to a
   worker thread; snapshots and restores go to the kernel thread (the caller's job).
 * Policy stays in plan.py / store.py; this module only applies it and reports it: one structured
   log line per store, hit, miss (with its reason) and eviction, and the matching metrics.
 * Disk tier (opt-in): files live in this model's subdirectory of the checkpoint directory, locked
   for the daemon's lifetime (disk_io.py); a second daemon of the same model gets ONE warning and
   serves from memory only. The index is rebuilt from file headers at start-up (``open_disk``,
   before the writer runs), in the recency order saved as file mtimes; payloads are read on first
   use. Writes happen in the checkpoint writer actor, off the request path (``write``; the header
   and its payload CRC are computed in the worker thread too). A directory unusable at start-up
   gives ONE warning and the daemon serves from memory only. A failed write (full, read-only, over a
   file-size limit) pauses writes with ONE warning and retries after a back-off (1 s doubling to
   5 min, write_backoff.py); the first write that succeeds ends the pause (one info line).
   Bad files (corrupt, truncated, other version) are removed with a warning and never restored:
   the request falls back to a fresh prefill (or a shorter checkpoint).
 * Shared disk tier (``shared=True``, ``--shared-checkpoint-dir``): the model's subdirectory is used
   by several daemons at once (shared_dir.py): no lock for the daemon's lifetime, new files of other
   daemons indexed by ``refresh`` (in ``refresh_loop``, asked for before each plan, which waits for
   it at most PLAN_LISTING_WAIT_S; every call on the mount under a deadline, ``_on_shared``),
   the byte budget kept by eviction passes under a lease after each write (the store itself never
   evicts disk entries then), and a file that vanished (evicted by another daemon) is a quiet miss.
 * Memory: a snapshot queued for the writer is held in the store's memory budget until written
   (``store.hold``); a capture whose write would break the budget is not written.
 * Recency of disk entries (hits, shared prompts) is saved as file mtimes by the writer
   (``FlushRecency``, at most one queued), so the disk tier's LRU order survives a restart.
 * Entry ids are the store's ids (blake2b-64 of the token ids, 16 hex digits), also the file stems.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import trio

from . import disk_io, page_format, shared_dir
from .disk_format import (KINDS as DISK_KINDS, SUFFIX, CheckpointFileError, Header, check_page_keys, file_name,
                          header_size, prefix_hash, read_header)
from ..engine.messages import FlushRecency, WriteCheckpoint
from .plan import PrefillPlan, common_prefix_len, plan_prefill
from .store import CheckpointStore, Entry, Eviction, Footprint, footprint
from .write_backoff import WriteBackoff

METRIC_TIER = {"memory": "ram", "disk": "disk"}   # the metric label values (daemon/service/metrics.py)
RESTORE_COST_MEMORY = 64     # prefill tokens a restore from memory is charged
RESTORE_COST_DISK = 128      # a disk-only entry must be read first
RELIST_EVERY_S = 10.0        # shared tier: list the directory at least this often, whatever its mtime says
                             # (a network file system may cache a directory's attributes for seconds)
SHARED_LIST_TIMEOUT_S = 30.0 # shared tier: a stat + listing that takes longer is given up (a hung mount)
SHARED_LOAD_TIMEOUT_S = 20.0 # shared tier: a request waits this long for a file, then prefills cold
PLAN_LISTING_WAIT_S = 0.25   # shared tier: planning waits at most this for the listing it asked for (a
                             # healthy mount answers in milliseconds), then plans with the last one


class SharedUnresponsive(Exception):
    """A call on the shared directory ran past its deadline, or an earlier one still has not returned."""


def miss_reason(detail: str | None) -> str:
    """A short metric label for a plan's ``store_miss`` phrase (the log keeps the phrase)."""
    d = detail or ""
    for prefix, label in (("no stored prefix matches", "no_match"), ("no stored prefix", "no_stored_prefix"),
                          ("stored prefixes all longer", "longer_than_prompt"),
                          ("live state is as good", "live_state_better"), ("checkpoint of", "not_worth_it"),
                          ("prompt log-probabilities", "all_logits"), ("no memory to restore", "no_memory")):
        if d.startswith(prefix):
            return label
    return "other"


class _MonotonicWallClock:
    """Unix time, but strictly increasing, so LRU order never ties (the API shows it as last_used)."""

    def __init__(self) -> None:
        self._last = 0.0

    def __call__(self) -> float:
        self._last = max(time.time(), self._last + 1e-6)
        return self._last


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """One row of GET /v1/checkpoints (the HTTP layer turns it into JSON)."""
    id: str
    tokens: int
    kind: str
    bytes: int
    tier: str          # "memory" | "disk" | "memory+disk"
    hits: int
    last_used: float
    own_bytes: int = 0      # its tail and the pages no other checkpoint references (memory, else disk)
    shared_bytes: int = 0   # pages other checkpoints reference too


def _whole(h: Header) -> int:
    """A disk checkpoint's whole snapshot size, from its header: the tail plus its page groups."""
    return h.payload_len + len(h.pages) * h.page_nbytes


class Checkpoints:
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

    # ---- planning -----------------------------------------------------------------------------

    def plan(self, prompt: np.ndarray, live_tokens, *, hint_tokens: int | None,
             need_all_logits: bool, turn_end_tokens: int | None = None,
             turn_tokens: int | None = None, exclude: frozenset[str] = frozenset()) -> PrefillPlan:
        n = int(prompt.shape[0])
        if need_all_logits:
            return PrefillPlan("fresh", 0, n, None, (), False, "prompt log-probabilities need every position",
                               "prompt log-probabilities need every position's logits")
        if not self.enabled:
            p = plan_prefill(prompt, live_tokens, self.store, min_tokens=n + 1)
            return PrefillPlan(p.action, p.start, p.end, None, (), False, p.live_miss, "checkpoints off")
        return plan_prefill(prompt, live_tokens, self.store, hint_tokens=hint_tokens, turn_tokens=turn_tokens,
                            previous_fresh_prompt=self.previous_fresh_prompt, min_tokens=self.min_tokens,
                            tail_guard=self.tail_guard, restore_cost_tokens=self._restore_cost,
                            turn_end_tokens=turn_end_tokens, exclude=exclude)

    def _restore_cost(self, entry: Entry) -> int:
        if entry.in_memory:
            return RESTORE_COST_MEMORY
        if self.shared and self._shared_hung():
            return entry.n_tokens     # the mount does not answer: a disk-only entry saves nothing now
        return RESTORE_COST_DISK

    def note_plan(self, plan: PrefillPlan, prompt: np.ndarray, request_id: str) -> None:
        """After the plan is final: shares, recency, the rule-2 memory, and the miss line."""
        if not self.enabled or plan.store_miss and plan.store_miss.startswith("prompt log-probabilities"):
            return
        self._note_recency(self.store.record_prompt(prompt))
        if plan.action != "reuse_live":
            self.previous_fresh_prompt = prompt
        if plan.action != "restore":
            self.miss(request_id, miss_reason(plan.store_miss), plan.store_miss or "")

    def miss(self, request_id: str, reason: str, detail: str) -> None:
        if self.log is not None:
            self.log.info("checkpoint_miss", request_id=request_id, reason=reason, detail=detail)
        if self.metrics is not None:
            self.metrics.checkpoint_misses.inc(reason=reason)

    # ---- restore ------------------------------------------------------------------------------

    async def snapshot_for(self, entry_id: str, request_id: str) -> tuple[Any, str]:
        """The snapshot of ``entry_id`` and the tier it came from; a disk-only entry is read with its
        pages and rebuilt (in a thread) and loaded into memory. None when the file or one of its
        pages went bad or vanished: the entry is dropped, a warning logged, and the caller plans
        again (a shorter checkpoint, the live state, or fresh)."""
        e = self.store.get(entry_id)
        if e is None:
            return None, "memory"
        if e.snapshot is not None:
            return e.snapshot, "memory"
        if not e.on_disk or self.disk_dir is None:
            self.store.remove(entry_id)
            return None, "disk"
        path = self.disk_dir / file_name(e.tokens)
        try:
            if self.shared:
                header, snap = await self._on_shared(self.shared_load_timeout_s, self._read, path)
            else:
                header, snap = await trio.to_thread.run_sync(self._read, path)
            if not np.array_equal(header.tokens, e.tokens):
                raise CheckpointFileError("token ids differ from the index")
        except SharedUnresponsive:
            if self.log is not None:
                self.log.warning("checkpoint_load_timeout", request_id=request_id, id=e.id, tokens=e.n_tokens,
                                 timeout_s=self.shared_load_timeout_s, action="prefill instead")
            self._forget_file(e.id, "shared directory did not answer in time", request_id, "shared_timeout")
            return None, "disk"
        except (CheckpointFileError, OSError) as err:
            if self.shared and isinstance(err, FileNotFoundError):
                self._forget_file(e.id, "evicted by another daemon", request_id)   # a miss, not an error
                return None, "disk"
            reason = err.reason if isinstance(err, CheckpointFileError) else f"unreadable: {err.strerror or err}"
            await self.drop_bad(e, reason, request_id, bad_page=getattr(err, "page", None))
            return None, "disk"
        if self.store.get(entry_id) is e:     # not deleted or evicted while the file was read
            self._apply(self.store.put(e.tokens, e.kind, snap))
            self._update_bytes()
        return snap, "disk"

    def _read(self, path: Path):
        """In a thread: a checkpoint file and its pages, verified, rebuilt into a kernel Snapshot. A
        page that is missing or damaged raises CheckpointFileError; the kernel refusing the parts too."""
        header, tail, pages = disk_io.load(path, self.fingerprint)
        if self.rebuild is None:     # no kernel (tools, tests): opaque blobs, a tail and no pages
            if pages:
                raise CheckpointFileError("no kernel to rebuild a paged snapshot")
            return header, tail
        try:
            snap = self.rebuild(tail, pages)
        except ValueError as err:     # KernelError: version, model, page layout, checksum
            raise CheckpointFileError(f"kernel refused the snapshot: {err}") from None
        check_page_keys(header, int(getattr(snap, "page_tokens", 0)))   # the model's page size (a blob: no pages)
        return header, snap

    def _forget_file(self, entry_id: str, reason: str, request_id: str | None = None,
                     miss_label: str = "evicted_elsewhere") -> None:
        """A shared file that is gone (or out of reach): the entry leaves the disk tier (keeps a
        loaded snapshot); a later listing indexes the file again if it is still there."""
        e = self.store.remove(entry_id, "disk")
        if e is None:
            return
        if self.log is not None:
            self.log.info("checkpoint_gone", request_id=request_id, id=entry_id, tokens=e.n_tokens, reason=reason)
        if request_id is not None:
            self.miss(request_id, miss_label, reason)
        self._update_bytes()

    async def drop_bad(self, e: Entry, reason: str, request_id: str | None = None, bad_page: str | None = None) -> None:
        """A checkpoint that must not be used (bad file or page, or the kernel refused the snapshot)."""
        if self.log is not None:
            self.log.warning("checkpoint_bad", request_id=request_id, id=e.id, tokens=e.n_tokens, reason=reason,
                             action="removed; prefill instead")
        was_on_disk, pages = e.on_disk, e.disk_pages
        self.store.remove(e.id)
        if was_on_disk and self.disk_dir is not None:
            await self._unlink(file_name(e.tokens))
            if bad_page is not None:    # a damaged page file: bad for every checkpoint that needs it (shared too)
                await self._unlink_pages([bad_page])
            await self._unlink_orphans(pages)
        label = ("fingerprint_mismatch" if "fingerprint" in reason else
                 "tokens_mismatch" if "tokens differ" in reason else
                 "page_keys_mismatch" if "page keys" in reason else "bad_file")
        self.miss(request_id or "", label, reason)
        self._update_bytes()

    async def check_restored(self, entry_id: str, state_tokens, expected: np.ndarray, request_id: str) -> bool:
        """After a restore: the state must hold exactly ``expected`` (the prompt's first tokens, as
        planned). A file's header tokens are only a claim: whoever can write the directory can
        write a matching header and CRC; the kernel state's own tokens decide the answer. On a
        mismatch the entry and its file are dropped (a warning) and the caller plans again."""
        got = np.asarray(state_tokens, dtype=np.int64)
        want = np.asarray(expected, dtype=np.int64)
        if got.shape == want.shape and np.array_equal(got, want):
            return True
        k = common_prefix_len(got, want)
        reason = (f"restored state's tokens differ from the prompt at token {k} "
                  f"(state holds {got.shape[0]}, the plan expects {want.shape[0]})")
        e = self.store.get(entry_id)
        if e is not None:
            await self.drop_bad(e, reason, request_id)
        elif self.log is not None:   # deleted while it was restored: its file is already gone
            self.log.warning("checkpoint_bad", request_id=request_id, id=entry_id, reason=reason,
                             action="prefill instead")
        return False

    def hit(self, entry_id: str, tier: str, request_id: str, prompt_tokens: int) -> None:
        if self.store.get(entry_id) is None:  # deleted (API, disk eviction) while it was being restored
            return
        e = self.store.touch(entry_id)
        self._note_recency([e])
        if self.log is not None:
            self.log.info("checkpoint_hit", request_id=request_id, id=e.id, kind=e.kind, tokens=e.n_tokens,
                          prompt_tokens=prompt_tokens, tier=tier)
        if self.metrics is not None:
            self.metrics.checkpoint_hits.inc(tier=METRIC_TIER[tier])
            self.metrics.prefill_tokens.inc(e.n_tokens, kind="restored")

    # ---- capture ------------------------------------------------------------------------------

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

    # ---- disk ---------------------------------------------------------------------------------

    async def open_disk(self) -> None:
        """Start-up, before the writer runs: create the directory, rebuild the index from headers,
        remove bad files (one warning each). An unusable directory: one warning, memory only."""
        if not self.enabled or self.disk_root is None:
            return
        if self.shared:
            return await self._open_shared()
        try:
            sub, self._lock = await trio.to_thread.run_sync(disk_io.lock_model_dir, self.disk_root, self.fingerprint)
        except disk_io.DirectoryBusy as e:
            self._disk_unavailable(e, "lock", action="serving with memory checkpoints only; the other daemon "
                                   "keeps this model's disk checkpoints")
            return
        except OSError as e:
            self._disk_unavailable(e, "open")
            return
        self.disk_dir = sub
        try:
            adopted = await trio.to_thread.run_sync(disk_io.adopt_flat_files, self.disk_root, sub, self.fingerprint)
            good, problems = await trio.to_thread.run_sync(disk_io.scan, sub, self.fingerprint)
        except OSError as e:
            self.close_disk()
            self._disk_unavailable(e, "open")
            return
        self.store.disk_max_bytes = self._disk_max_bytes
        self.disk_enabled = True
        for p in problems:
            if self.log is not None:
                self.log.warning("checkpoint_file_bad", path=str(p.path), reason=p.reason, removed=p.removed)
        for path, files, nbytes in await trio.to_thread.run_sync(disk_io.older_formats, self.disk_root, self.fingerprint):
            if self.log is not None and files:
                self.log.warning("checkpoint_files_old_format", dir=str(path), files=files, bytes=nbytes,
                                 reason="written by another snapshot format (before paged state, another page "
                                        "size, before the key named the build's rounding) or by a kernel build "
                                        "that rounds otherwise (x86-64-v2 vs FMA); never restored",
                                 action="delete the directory to reclaim the space (unless a daemon of the "
                                        "other build still uses it)")
        if adopted and self.log is not None:
            self.log.info("checkpoint_files_adopted", dir=str(sub), files=len(adopted),
                          reason="moved from the flat layout of an earlier version")
        for f in good:              # least recently used first
            h = f.header
            evs = self.store.put_disk(h.tokens, h.kind, _whole(h), h.file_len, last_used=f.last_used,
                                      pages=disk_io.page_files(h))
            await self._unlink_evicted(self._apply(evs))
        referenced = {name for e in self.store.entries() if e.on_disk for name, _ in e.disk_pages}
        orphans = await trio.to_thread.run_sync(disk_io.remove_orphan_pages, sub, referenced)
        if orphans and self.log is not None:
            self.log.info("checkpoint_pages_orphaned", dir=str(sub), removed=len(orphans),
                          reason="no checkpoint file references them (an interrupted write or eviction)")
        if self.log is not None:
            st = self.store.stats()
            self.log.info("checkpoint_disk_index", dir=str(self.disk_dir), entries=st.disk_entries,
                          bytes=st.disk_bytes, removed=len(problems))
        self._update_bytes()

    async def _open_shared(self) -> None:
        try:
            self.disk_dir = await trio.to_thread.run_sync(shared_dir.open_shared, self.disk_root, self.fingerprint)
        except OSError as e:
            self._disk_unavailable(e, "open")
            return
        # The store never evicts shared files itself: eviction passes under the lease keep the budget.
        self.store.disk_max_bytes = 1 << 62
        self.disk_enabled = True
        await self.refresh(force=True)
        await self._evict_shared()
        if self.log is not None:
            st = self.store.stats()
            self.log.info("checkpoint_disk_index", dir=str(self.disk_dir), entries=st.disk_entries,
                          bytes=st.disk_bytes, shared=True)

    async def refresh_before_plan(self, wait_s: float = PLAN_LISTING_WAIT_S) -> None:
        """Before a plan: ask ``refresh_loop`` for a listing that starts now and wait for it at most
        ``wait_s`` (none at all while the mount is known to hang), so a peer's file published just
        before is usually found. Past that the plan uses the index as the last listing left it: a
        slow or hung mount never holds a request for longer."""
        if not (self.shared and self.disk_enabled and self._loop_running):
            return
        target = self._refreshes + (2 if self._refreshing else 1)   # a listing already running may predate the file
        self._refresh_wanted.set()
        if self._shared_hung():
            return
        with trio.move_on_after(wait_s):
            while self._refreshes < target:
                await self._refresh_done.wait()

    async def refresh_loop(self) -> None:
        """Shared tier, in the checkpoint writer's nursery: refresh when asked
        (``refresh_before_plan``) or every RELIST_EVERY_S, each listing under its deadline."""
        self._loop_running = True
        try:
            while True:
                with trio.move_on_after(RELIST_EVERY_S):
                    await self._refresh_wanted.wait()
                self._refresh_wanted = trio.Event()
                try:
                    await self.refresh()
                finally:
                    self._refreshes += 1
                    self._refresh_done.set()
                    self._refresh_done = trio.Event()
        finally:
            self._loop_running = False

    def _shared_hung(self) -> bool:
        """True while a shared call that ran past its deadline has not returned. The first call
        after it returns logs the recovery (once)."""
        if self._hung is None:
            return False
        if not self._hung.is_set():
            return True
        self._hung = None
        if self.log is not None:
            self.log.info("checkpoint_shared_responsive", dir=str(self.disk_dir),
                          action="shared checkpoints are listed and loaded again")
        return False

    async def _on_shared(self, timeout_s: float, fn, *args):
        """``fn(*args)`` in a thread, given up after ``timeout_s``: a hung mount blocks the thread,
        never the caller. The thread is abandoned, not killed (it cannot be); until it returns no
        other call goes to the mount (raises SharedUnresponsive at once), so threads do not pile up
        on a dead server. The state change is logged once each way."""
        if self._shared_hung():
            raise SharedUnresponsive()
        returned = threading.Event()

        def call():
            try:
                return fn(*args)
            finally:
                returned.set()

        with trio.move_on_after(timeout_s):
            return await trio.to_thread.run_sync(call, abandon_on_cancel=True)
        self._hung = returned
        if self.log is not None:
            self.log.warning("checkpoint_shared_unresponsive", dir=str(self.disk_dir), call=fn.__name__,
                             timeout_s=timeout_s, action="planning without new listings; shared loads are misses "
                             "until the call returns")
        raise SharedUnresponsive()

    async def refresh(self, force: bool = False) -> None:
        """Shared tier: index files other daemons published, forget files they evicted. Cheap when
        nothing changed (one stat of the directory); one refresh at a time, and the stat and the
        listing each get ``shared_list_timeout_s`` (a hung mount: this refresh is given up)."""
        if not (self.shared and self.disk_enabled and self.disk_dir is not None) or self._refreshing:
            return
        self._refreshing = True
        try:
            try:
                t = self.shared_list_timeout_s
                mtime = await self._on_shared(t, shared_dir.dir_mtime, self.disk_dir)
                stale = trio.current_time() - self._listed_at >= RELIST_EVERY_S
                if mtime == self._dir_mtime and not (force or stale):
                    return
                self._listed_at = trio.current_time()
                known = {file_name(e.tokens) for e in self.store.entries() if e.on_disk} | self._left_alone
                ch = await self._on_shared(t, shared_dir.changes, self.disk_dir, self.fingerprint, known)
            except SharedUnresponsive:
                return
            except OSError as err:
                if self.log is not None:
                    self.log.warning("checkpoint_refresh_failed", dir=str(self.disk_dir),
                                     error=f"{err.strerror or err}")
                return
            self._dir_mtime = mtime
            for p in ch.problems:
                if not p.removed:
                    self._left_alone.add(p.path.name)
                if self.log is not None:
                    self.log.warning("checkpoint_file_bad", path=str(p.path), reason=p.reason, removed=p.removed)
            self._left_alone.difference_update(ch.gone)
            for name in ch.gone:
                if self.store.get(name.removesuffix(SUFFIX)) is not None:
                    self._forget_file(name.removesuffix(SUFFIX), "evicted by another daemon")
            for f in ch.found:
                h = f.header
                self._apply(self.store.put_disk(h.tokens, h.kind, _whole(h), h.file_len, last_used=f.last_used,
                                                pages=disk_io.page_files(h)))
            if (ch.found or ch.gone) and self.log is not None:
                self.log.info("checkpoint_disk_refresh", dir=str(self.disk_dir), new=len(ch.found), gone=len(ch.gone))
            self._update_bytes()
        finally:
            self._refreshing = False

    async def _evict_shared(self) -> None:
        """One eviction pass over the shared directory (waits for the lease), then the index
        forgets what it deleted."""
        try:
            res = await trio.to_thread.run_sync(shared_dir.evict_pass, self.disk_dir, self._disk_max_bytes)
        except OSError as err:
            if self.log is not None:
                self.log.warning("checkpoint_evict_failed", dir=str(self.disk_dir), error=f"{err.strerror or err}")
            return
        if res.skipped:
            if self.log is not None:
                self.log.warning("checkpoint_evict_skipped", dir=str(self.disk_dir),
                                 reason="another daemon held the eviction lease too long; the next pass catches up")
            return
        if res.unreadable and self.log is not None:
            self.log.warning("checkpoint_page_sweep_skipped", dir=str(self.disk_dir), unreadable=list(res.unreadable),
                             reason="a checkpoint header could not be read, so the pages it references are "
                                    "unknown; a later pass sweeps")
        for name in res.removed:
            e = self.store.remove(name.removesuffix(SUFFIX), "disk")
            if e is not None:   # the pass deleted its page files that nothing references
                self._apply([Eviction(e, "disk", self.store.get(e.id) is None)])
        if (res.removed or res.temps_removed) and self.log is not None:
            self.log.info("checkpoint_disk_evict_pass", removed=len(res.removed), temps_removed=res.temps_removed,
                          bytes_after=res.bytes_after, max_bytes=self._disk_max_bytes)
        self._update_bytes()

    def close_disk(self) -> None:
        """Release this model's checkpoint subdirectory (the writer does, when it stops)."""
        self.disk_enabled = False
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def _disk_unavailable(self, err: OSError, during: str,
                          action: str = "serving with memory checkpoints only") -> None:
        self.disk_enabled = False
        if not self._disk_warned and self.log is not None:
            self.log.warning("checkpoint_disk_unavailable", dir=str(self.disk_dir or self.disk_root), during=during,
                             error=f"{type(err).__name__}: {err.strerror or err}", action=action)
        self._disk_warned = True

    def _write_failed(self, err: OSError, msg: WriteCheckpoint) -> None:
        """A write failed (full disk, read-only, quota): pause disk writes, retry after the back-off.
        One warning when the pause starts; a failed retry only lengthens it (write_backoff.py)."""
        starts = self.write_backoff.failed(trio.current_time())
        if starts and self.log is not None:
            self.log.warning("checkpoint_disk_writes_paused", dir=str(self.disk_dir), id=msg.id,
                             error=f"{type(err).__name__}: {err.strerror or err}",
                             retry_in_s=self.write_backoff.delay_s,
                             action="serving with memory checkpoints; a later capture retries the write "
                                    f"(back-off doubling up to {self.write_backoff.max_s:g} s)")

    async def handle(self, msg: WriteCheckpoint | FlushRecency) -> None:
        """The checkpoint writer's job for one message."""
        if isinstance(msg, FlushRecency):
            self._flush_queued = False
            await self.flush_recency()
        else:
            await self.write(msg)

    async def flush_recency(self) -> None:
        """Save the recency of used disk entries as their files' mtimes."""
        times, self._recency = self._recency, {}
        if not times or not self.disk_enabled or self.disk_dir is None:
            return
        try:
            await trio.to_thread.run_sync(disk_io.touch, self.disk_dir, times)
        except OSError as err:
            if self.log is not None:
                self.log.warning("checkpoint_recency_not_saved", files=len(times), error=f"{err.strerror or err}")

    async def write(self, msg: WriteCheckpoint) -> None:
        """The checkpoint writer's job for one WriteCheckpoint: header + payload, atomically and
        durably. The snapshot stops counting against the memory budget once this returns."""
        try:
            await self._write(msg)
        finally:
            self.store.release(msg.id)
            self._no_write.discard(msg.id)

    async def _write(self, msg: WriteCheckpoint) -> None:
        if not self.disk_enabled or self.disk_dir is None or msg.id in self._no_write:
            return
        if not self.write_backoff.allows(trio.current_time()):
            return   # queued before a write failed: dropped, the retry is the first capture after the pause
        e = self.store.get(msg.id)
        if e is not None and e.on_disk:
            return
        snap = msg.snapshot
        n_pages = int(getattr(snap, "n_full_pages", 0))
        size = (header_size(self.fingerprint, int(msg.tokens.shape[0]), n_pages) + footprint(snap).own
                + n_pages * page_format.file_size(int(getattr(snap, "page_nbytes", 0))))
        if size > self._disk_max_bytes:
            if self.log is not None:
                self.log.info("checkpoint_write_skipped", id=msg.id, bytes=size, reason="larger than the disk budget")
            return
        t0 = time.perf_counter()
        last_used = float(e.last_used) if e is not None else None
        try:
            # Not abandoned on cancel (trio's default): a shutdown waits for the rename, never
            # leaving a temp file behind a live lock.
            if self.shared and await trio.to_thread.run_sync((self.disk_dir / file_name(msg.tokens)).exists):
                # another daemon published this prefix (same name, same content): index it
                file_len, pages = await trio.to_thread.run_sync(self._published, file_name(msg.tokens))
            else:
                file_len, pages = await trio.to_thread.run_sync(
                    disk_io.write_checkpoint, self.disk_dir, self.fingerprint, msg.kind, msg.tokens, snap, last_used)
        except OSError as err:
            self._write_failed(err, msg)
            return
        if self.write_backoff.succeeded() and self.log is not None:
            self.log.info("checkpoint_disk_writes_resumed", dir=str(self.disk_dir), id=msg.id)
        if msg.id in self._no_write:            # deleted through the API while it was being written
            await self._unlink(file_name(msg.tokens))
            await self._unlink_orphans(pages)
            return
        evictions = self.store.put_disk(msg.tokens, msg.kind, footprint(snap).nbytes, file_len, last_used=last_used,
                                        pages=pages)
        if self.log is not None:
            e = self.store.get(msg.id)
            own, shared = self.store.disk_breakdown(e) if e is not None else (0, 0)
            self.log.info("checkpoint_store", id=msg.id, kind=msg.kind, tokens=int(msg.tokens.shape[0]),
                          bytes=file_len, own_bytes=own, shared_bytes=shared, pages=len(pages), tier="disk",
                          write_ms=round((time.perf_counter() - t0) * 1000, 2))
        await self._unlink_evicted(self._apply(evictions))
        if self.shared:
            await self._evict_shared()
        self._update_bytes()

    def _published(self, name: str) -> tuple[int, list[tuple[str, int]]]:
        """In a thread: the size and page files of a checkpoint a peer already published."""
        with open(self.disk_dir / name, "rb") as f:
            h = read_header(f, self.fingerprint)
        return h.file_len, disk_io.page_files(h)

    async def _unlink_evicted(self, evictions: list[Eviction]) -> None:
        """Delete the files of disk evictions: the checkpoint, then the page files nothing else needs."""
        for ev in evictions:
            if ev.tier == "disk":
                await self._unlink(file_name(ev.entry.tokens))
                await self._unlink_pages(ev.pages_freed)

    async def _unlink_orphans(self, pages) -> None:
        """The page files of ``pages`` (a checkpoint that left the disk tier) no indexed checkpoint
        references. Not in a shared directory: this index lacks the checkpoints peers published
        since its last listing, which may reference them; there only the eviction pass, under the
        lease and from the whole directory's headers, deletes pages (shared_dir.evict_pass)."""
        if not self.shared:
            await self._unlink_pages(self.store.orphan_pages(pages))

    async def _unlink_pages(self, names) -> None:
        if self.disk_dir is None or (self._lock is None and not self.shared):
            return
        for name in list(names):
            try:
                await trio.to_thread.run_sync(disk_io.remove_page, self.disk_dir, name)
            except OSError as err:
                if self.log is not None:
                    self.log.warning("checkpoint_remove_failed", file=f"pages/{name}", error=f"{err.strerror or err}")

    async def _unlink(self, name: str) -> None:
        if self.disk_dir is None or (self._lock is None and not self.shared):   # no file effects without the lock
            return
        try:
            await trio.to_thread.run_sync(disk_io.remove, self.disk_dir, name)
        except OSError as err:
            if self.log is not None:
                self.log.warning("checkpoint_remove_failed", file=name, error=f"{err.strerror or err}")

    # ---- the operator's view (GET / DELETE /v1/checkpoints, /v1/status) ----------------------

    def listing(self) -> list[CheckpointInfo]:
        """Every entry, most recently used first."""
        out = []
        for e in self.store.entries():
            tier = "+".join(t for t, on in (("memory", e.in_memory), ("disk", e.on_disk)) if on)
            own, shared = self.store.breakdown(e) if e.in_memory else self.store.disk_breakdown(e)
            out.append(CheckpointInfo(e.id, e.n_tokens, e.kind, e.nbytes, tier, e.hits, float(e.last_used),
                                      own, shared))
        return out

    async def delete(self, entry_id: str) -> bool:
        """Drop one entry: its snapshot in memory, its file and the page files only it needed. False when unknown."""
        e = self.store.get(entry_id)
        if e is None:
            return False
        on_disk, pages = e.on_disk, e.disk_pages
        self.store.remove(entry_id)
        if self.store.is_held(entry_id):
            self._no_write.add(entry_id)   # its queued write must not bring it back
        if on_disk or self.disk_enabled:
            await self._unlink(file_name(e.tokens))
            await self._unlink_orphans(pages)
        if self.log is not None:
            self.log.info("checkpoint_deleted", id=entry_id, tokens=e.n_tokens, kind=e.kind)
        self._update_bytes()
        return True

    def checkpoint_stats(self) -> dict[str, Any]:
        """Plain numbers for /v1/status: entries and bytes per tier, budgets, kinds, hits."""
        st = self.store.stats()
        return {
            "enabled": self.enabled,
            "memory": {"entries": st.memory_entries, "bytes": st.memory_bytes, "queued_bytes": st.queued_bytes,
                       "max_entries": self.store.max_slots, "max_bytes": self.store.max_bytes},
            "disk": {"enabled": self.disk_enabled, "dir": str(self.disk_dir or self.disk_root) if self.disk_root else None,
                     "entries": st.disk_entries, "bytes": st.disk_bytes,
                     "max_bytes": self._disk_max_bytes if self.shared else self.store.disk_max_bytes,
                     "shared": self.shared,
                     "writes_paused_s": self.write_backoff.delay_s},
            "by_kind": dict(st.entries_by_kind),
            "hits": st.hits,
            "protected_id": st.protected_id,
            "min_tokens": self.min_tokens,
        }
