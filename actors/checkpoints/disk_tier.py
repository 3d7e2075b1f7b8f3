"""Checkpoints, the local disk tier (opt-in): open the model's subdirectory and rebuild the index at
start-up, and the checkpoint writer's jobs (write a checkpoint, save recency), and file removal.

Files live in this model's subdirectory of the checkpoint directory, locked for the daemon's lifetime
(disk_io.py); a second daemon of the same model gets ONE warning and serves from memory only. The
index is rebuilt from file headers at start-up (``open_disk``, before the writer runs), in the
recency order saved as file mtimes; payloads are read on first use. Writes happen in the checkpoint
writer actor, off the request path (``write``; the header and its payload CRC are computed in the
worker thread too). A directory unusable at start-up gives ONE warning and the daemon serves from
memory only. A failed write (full, read-only, over a file-size limit) pauses writes with ONE warning
and retries after a back-off (1 s doubling to 5 min, write_backoff.py); the first write that
succeeds ends the pause (one info line). Bad files (corrupt, truncated, other version) are removed
with a warning and never restored.
"""

from __future__ import annotations

import time

import trio

from ..engine.messages import FlushRecency, WriteCheckpoint
from . import disk_io, page_format
from .disk_format import Header, file_name, header_size, read_header
from .store import Eviction, footprint


def whole_bytes(h: Header) -> int:
    """A disk checkpoint's whole snapshot size, from its header: the tail plus its page groups."""
    return h.payload_len + len(h.pages) * h.page_nbytes


class DiskTier:
    """The disk tier and the writer's jobs. Uses the attributes set in ``Checkpoints.__init__``:
    enabled, fingerprint, store, disk_root, disk_dir, disk_enabled, shared, write_backoff, log,
    _lock, _disk_max_bytes, _disk_warned, _no_write, _recency, _flush_queued. Calls the other
    parts: _apply, _update_bytes (capture), _open_shared, _evict_shared (shared tier)."""

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
            evs = self.store.put_disk(h.tokens, h.kind, whole_bytes(h), h.file_len, last_used=f.last_used,
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
