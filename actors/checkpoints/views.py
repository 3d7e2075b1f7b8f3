"""Checkpoints, the operator's views: GET / DELETE /v1/checkpoints and the checkpoint part of
/v1/status, as plain values (the HTTP layer turns them into JSON)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .disk_format import file_name


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


class OperatorViews:
    """Listing, deleting and the status numbers. Uses the attributes set in ``Checkpoints.__init__``:
    enabled, min_tokens, store, disk_root, disk_dir, disk_enabled, shared, write_backoff, log,
    _disk_max_bytes, _no_write. Calls the other parts: _update_bytes (capture), _unlink,
    _unlink_orphans (disk tier)."""

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
