"""Checkpoints, the shared disk tier (``shared=True``, ``--shared-checkpoint-dir``): the model's
subdirectory is used by several daemons at once (shared_dir.py), with no lock for the daemon's
lifetime.

New files of other daemons are indexed by ``refresh`` (in ``refresh_loop``, asked for before each
plan, which waits for it at most PLAN_LISTING_WAIT_S); every call on the mount runs under a deadline
(``_on_shared``), so a hung mount blocks a thread, never a request. The byte budget is kept by
eviction passes under a lease after each write (the store itself never evicts disk entries then),
and a file that vanished (evicted by another daemon) is a quiet miss.
"""

from __future__ import annotations

import threading

import trio

from . import disk_io, shared_dir
from .disk_format import SUFFIX, file_name
from .disk_tier import whole_bytes
from .store import Eviction

RELIST_EVERY_S = 10.0        # shared tier: list the directory at least this often, whatever its mtime says
                             # (a network file system may cache a directory's attributes for seconds)
SHARED_LIST_TIMEOUT_S = 30.0 # shared tier: a stat + listing that takes longer is given up (a hung mount)
SHARED_LOAD_TIMEOUT_S = 20.0 # shared tier: a request waits this long for a file, then prefills cold
PLAN_LISTING_WAIT_S = 0.25   # shared tier: planning waits at most this for the listing it asked for (a
                             # healthy mount answers in milliseconds), then plans with the last one


class SharedUnresponsive(Exception):
    """A call on the shared directory ran past its deadline, or an earlier one still has not returned."""


class SharedTier:
    """Listing, loading from and evicting in a shared directory. Uses the attributes set in
    ``Checkpoints.__init__``: shared, fingerprint, store, disk_root, disk_dir, disk_enabled,
    shared_list_timeout_s, log, _disk_max_bytes, _dir_mtime, _listed_at, _left_alone, _refreshing,
    _hung, _refresh_wanted, _refresh_done, _refreshes, _loop_running. Calls the other parts: _apply,
    _update_bytes (capture), _disk_unavailable (disk tier), _forget_file (restore)."""

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
                self._apply(self.store.put_disk(h.tokens, h.kind, whole_bytes(h), h.file_len, last_used=f.last_used,
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
