"""The prefix-checkpoint index: lookup by token-id prefix, two budgeted tiers, eviction order.

Pure policy: no I/O, no threads, no trio. Snapshots are opaque; the store only reads their
``Footprint`` (own bytes and the page groups they reference). Files are named by the entry id
(``disk_format.file_name``) and written / deleted by the caller, told what to do by the
``Eviction`` records that ``put`` / ``put_disk`` return.

Design notes
 * Key = the exact token ids. The id is ``prefix_hash(tokens)`` (blake2b-64 of int32 LE ids);
   a lookup hashes the prompt's prefixes at the few stored lengths (one incremental pass) and
   then compares the ids, so a hash collision can never restore the wrong state.
 * Two tiers, each with a slot budget and a byte budget:
     memory: entries whose snapshot is loaded; counts each one's own bytes (its copied tail) plus
             every page group any of them references, once: a group ten checkpoints share counts
             once, and leaves only with the last of them;
     disk:   entries with a file; counts the checkpoint files plus every page file they reference,
             once (``pages_freed`` of an eviction: the page files no entry references any more).
   Off when disk_max_bytes == 0. An entry may be in both. ``tier`` is "memory" when the snapshot is
   loaded, else "disk".
 * Bytes are the limit. The slot count stays only as a bound on bookkeeping (each request hashes
   the prompt at every distinct stored length, and the status lists every entry), so its
   default is generous; it no longer stands in for memory.
 * Eviction, per tier, runs while the tier is over either budget. Victims in order:
     1. turn-end captures (prompt_end, reply_end), least recently used first;
     2. prefix captures (common, system), least recently used first;
     3. the entry just added (it is refused rather than push out the protected entry);
     4. the protected entry (only when it alone breaks the budget).
   An entry larger than the whole byte budget is refused at once, evicting nothing.
   Protected = the one "system" entry of that tier with the largest shares × n_tokens (the
   prefill tokens it has saved or would save), ties to the most recently used; if the tier
   holds no "system" entry, the same rule over "common" entries. ``shares`` counts requests whose
   prompt started with the entry's tokens (``record_prompt``), whether they were then served by
   the live state, this entry, or a longer one. So a burst of side requests (titles, sub-agents),
   each leaving a prompt_end and maybe a common capture, evicts only other captures: it cannot push
   out the main session's system prefix while any other victim exists. A new system prompt takes
   the protection over once its shares × tokens exceed the old one's; until then the old one
   holds at most one slot.
 * Snapshots queued for the disk writer (``hold`` / ``release``) count against the memory byte budget
   until written, also after their entry left memory: the budget bounds everything the store holds
   or has queued. Evicting a held entry frees a slot but no bytes: it is evicted only for a slot,
   eviction for bytes passes over it; ``can_hold`` tells the caller whether one more queued one fits.
 * Recency uses an injected clock (default: a counter ticking once per operation), so tests are
   deterministic.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Collection, Literal, Sequence

import numpy as np

from .disk_format import KINDS as DISK_KINDS, as_tokens, prefix_hash

# reply_end: the state after a reply (actors/engine/decode.py), memory only: the prompt it serves holds the
# reply's generated ids, which only this process's reply table brings back (daemon/protocol/reply_ids.py)
KINDS = DISK_KINDS + ("reply_end",)
TURN_ENDS = ("prompt_end", "reply_end")     # evicted first
Kind = Literal["system", "common", "prompt_end", "reply_end"]
Tier = Literal["memory", "disk"]


@dataclass(frozen=True, slots=True)
class Footprint:
    """What a snapshot holds in memory: bytes of its own, and page groups it may share with others."""

    own: int
    pages: tuple[int, ...] = ()
    page_nbytes: int = 0

    @property
    def nbytes(self) -> int:
        """Everything it references, shared or not."""
        return self.own + len(self.pages) * self.page_nbytes


def footprint(snapshot: Any) -> Footprint:
    """A kernel Snapshot's footprint (a bytes-like object: all its own, sharing nothing)."""
    if isinstance(snapshot, (bytes, bytearray, memoryview)):
        return Footprint(len(snapshot))
    return Footprint(int(snapshot.own_nbytes), tuple(int(i) for i in snapshot.page_ids), int(snapshot.page_nbytes))


@dataclass(slots=True, eq=False)
class Entry:
    """One stored prefix. Owned by the store: read it, do not mutate it."""

    id: str                 # prefix_hash(tokens), 16 hex digits; also the file stem
    tokens: np.ndarray      # (n_tokens,) int32, read-only
    kind: str               # "system" | "common" | "prompt_end" | "reply_end"
    snapshot: Any           # the kernel Snapshot; None when only on disk (not loaded)
    nbytes: int             # its whole size, shared pages included (from the header for disk-only entries)
    on_disk: bool = False
    disk_nbytes: int = 0    # checkpoint file size when on_disk
    mem: Footprint | None = None     # set while the snapshot is loaded
    disk_pages: tuple[tuple[str, int], ...] = ()   # (page file name, bytes) it references, when on_disk
    hits: int = 0           # restores served (touch)
    shares: int = 1         # requests whose prompt started with these tokens (record_prompt)
    created: float = 0
    last_used: float = 0

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def in_memory(self) -> bool:
        return self.snapshot is not None

    @property
    def tier(self) -> Tier:
        return "memory" if self.snapshot is not None else "disk"

    def __repr__(self) -> str:
        where = "+".join(t for t, on in (("memory", self.in_memory), ("disk", self.on_disk)) if on)
        return (f"Entry({self.id} {self.kind} n={self.n_tokens} {where} {self.nbytes}B "
                f"hits={self.hits} shares={self.shares} used={self.last_used})")


@dataclass(frozen=True, slots=True)
class Eviction:
    """``entry`` left ``tier``. tier "memory": its snapshot was dropped. tier "disk": the caller must
    delete its file, and the page files in ``pages_freed`` (no other entry references them).
    ``dropped``: the entry is no longer indexed at all."""

    entry: Entry
    tier: Tier
    dropped: bool
    pages_freed: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class StoreStats:
    memory_entries: int
    memory_bytes: int
    disk_entries: int
    disk_bytes: int
    entries_by_kind: dict[str, int]
    hits: int
    protected_id: str | None
    queued_bytes: int = 0   # held for the disk writer and not in memory (also counted by the budget)
    shared_bytes: int = 0   # of memory_bytes: page groups two or more entries reference


class CheckpointStore:
    def __init__(self, *, max_slots: int = 64, max_bytes: int = 1 << 30,
                 disk_max_slots: int | None = None, disk_max_bytes: int = 0,
                 protect_system: bool = True, clock: Callable[[], float] | None = None):
        if max_slots < 0 or max_bytes < 0 or disk_max_bytes < 0 or (disk_max_slots or 0) < 0:
            raise ValueError("budgets must be >= 0")
        self.max_slots = max_slots
        self.max_bytes = max_bytes
        self.disk_max_slots = disk_max_slots
        self.disk_max_bytes = disk_max_bytes
        self.protect_system = protect_system
        self._clock = clock or itertools.count(1).__next__
        self._by_id: dict[str, Entry] = {}
        self._held: dict[str, Footprint] = {}   # entry id -> a snapshot queued for the disk writer
        # memory_usage / memory_pages / memory_own_bytes, computed once per change (the memory guard
        # asks before every decode step; a tier of many checkpoints references tens of thousands of groups)
        self._mem_cache: tuple[int, dict[int, int], int] | None = None

    # ---- lookup -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, entry_id: str) -> Entry | None:
        return self._by_id.get(entry_id)

    def entries(self) -> list[Entry]:
        """All entries, most recently used first."""
        return sorted(self._by_id.values(), key=lambda e: (e.last_used, e.created, e.id), reverse=True)

    def contains(self, tokens: Sequence[int] | np.ndarray) -> bool:
        ids = as_tokens(tokens)
        e = self._by_id.get(prefix_hash(ids))
        return e is not None and np.array_equal(e.tokens, ids)

    def prefixes_of(self, prompt: Sequence[int] | np.ndarray) -> list[Entry]:
        """Every stored entry whose tokens are a prefix of (or equal to) ``prompt``, longest first."""
        ids = as_tokens(prompt)
        raw = ids.astype("<i4", copy=False).tobytes()
        lengths = sorted({e.n_tokens for e in self._by_id.values() if e.n_tokens <= ids.shape[0]})
        found: list[Entry] = []
        h, done = hashlib.blake2b(digest_size=8), 0
        for n in lengths:
            h.update(raw[4 * done: 4 * n])
            done = n
            e = self._by_id.get(h.copy().hexdigest())
            if e is not None and e.n_tokens == n and np.array_equal(e.tokens, ids[:n]):
                found.append(e)
        return found[::-1]

    def longest_prefix(self, prompt: Sequence[int] | np.ndarray, *, strict: bool = True) -> Entry | None:
        """The longest stored prefix of ``prompt``: strictly shorter unless ``strict=False``
        (an equal-length snapshot is usable too: it carries the last logits)."""
        n = len(prompt)
        for e in self.prefixes_of(prompt):
            if e.n_tokens < n or not strict:
                return e
        return None

    @property
    def protected_id(self) -> str | None:
        """The protected entry of the memory tier (see the module notes)."""
        p = self._protected([e for e in self._by_id.values() if e.in_memory])
        return p.id if p else None

    def stats(self) -> StoreStats:
        mem = [e for e in self._by_id.values() if e.in_memory]
        disk = [e for e in self._by_id.values() if e.on_disk]
        kinds = {k: sum(e.kind == k for e in self._by_id.values()) for k in KINDS}
        refs = self._page_refs(e.mem for e in mem)
        shared = sum(size for pid, (n, size) in refs.items() if n > 1)
        return StoreStats(len(mem), self._usage([e.mem for e in mem]), len(disk), self.disk_usage(),
                          kinds, sum(e.hits for e in self._by_id.values()), self.protected_id,
                          self.queued_bytes, shared)

    def breakdown(self, entry: Entry) -> tuple[int, int]:
        """(own, shared) bytes of an entry's loaded snapshot: own = its tail plus the page groups no
        other loaded entry references; shared = the groups others reference too. (0, 0) if not loaded."""
        if entry.mem is None:
            return 0, 0
        refs = self._page_refs(e.mem for e in self._by_id.values() if e.in_memory)
        shared = sum(refs[p][1] for p in set(entry.mem.pages) if refs[p][0] > 1)
        return entry.mem.nbytes - shared, shared

    def disk_breakdown(self, entry: Entry) -> tuple[int, int]:
        """(own, shared) bytes of an entry's files: own = its checkpoint file plus the page files no
        other entry on disk references; shared = the page files others reference too."""
        if not entry.on_disk:
            return 0, 0
        refs = self._disk_page_refs(self._by_id.values())
        shared = sum(size for name, size in set(entry.disk_pages) if refs[name] > 1)
        return entry.disk_nbytes + sum(size for _, size in set(entry.disk_pages)) - shared, shared

    # ---- accounting -----------------------------------------------------------------------------

    @staticmethod
    def _page_refs(footprints) -> dict[int, tuple[int, int]]:
        """page id -> (how many footprints reference it, its bytes)."""
        refs: dict[int, tuple[int, int]] = {}
        for fp in footprints:
            for p in set(fp.pages):
                n, _ = refs.get(p, (0, 0))
                refs[p] = (n + 1, fp.page_nbytes)
        return refs

    @staticmethod
    def _usage(footprints) -> int:
        """Own bytes of each footprint plus every page group they reference, once."""
        own, pages = 0, {}
        for fp in footprints:
            own += fp.own
            for p in fp.pages:
                pages[p] = fp.page_nbytes
        return own + sum(pages.values())

    def _resident(self) -> list[Footprint]:
        """Every footprint in memory: loaded entries, and queued ones that are not loaded."""
        out = [e.mem for e in self._by_id.values() if e.in_memory]
        out += [fp for i, fp in self._held.items() if not self._in_memory(i)]
        return out

    def _memory(self) -> tuple[int, dict[int, int], int]:
        if self._mem_cache is None:
            resident = self._resident()
            pages = {p: fp.page_nbytes for fp in resident for p in fp.pages}
            own = sum(fp.own for fp in resident)
            self._mem_cache = (own + sum(pages.values()), pages, own)
        return self._mem_cache

    def memory_pages(self) -> dict[int, int]:
        """Every page group the memory tier (queued snapshots included) references: id -> bytes."""
        return dict(self._memory()[1])

    def memory_own_bytes(self) -> int:
        """The memory tier's bytes outside page groups (tails), queued snapshots included."""
        return self._memory()[2]

    @staticmethod
    def _disk_page_refs(entries) -> dict[str, int]:
        refs: dict[str, int] = {}
        for e in entries:
            if e.on_disk:
                for name, _ in set(e.disk_pages):
                    refs[name] = refs.get(name, 0) + 1
        return refs

    def disk_usage(self) -> int:
        """Checkpoint files plus every page file they reference, once."""
        pages: dict[str, int] = {}
        files = 0
        for e in self._by_id.values():
            if e.on_disk:
                files += e.disk_nbytes
                pages.update(e.disk_pages)
        return files + sum(pages.values())

    # ---- snapshots held outside the store (queued for the disk writer) ------------------------------

    def is_held(self, entry_id: str) -> bool:
        return entry_id in self._held

    @property
    def queued_bytes(self) -> int:
        """Bytes the queued snapshots add to the memory tier (those not loaded, beyond shared pages)."""
        return self.memory_usage() - self._usage([e.mem for e in self._by_id.values() if e.in_memory])

    def memory_usage(self) -> int:
        """What the memory byte budget bounds: loaded snapshots plus queued ones, pages once."""
        return self._memory()[0]

    def can_hold(self, entry_id: str, snapshot: Any) -> bool:
        """Would queueing ``snapshot`` for ``entry_id`` keep the memory budget?"""
        if self._in_memory(entry_id) or entry_id in self._held:
            return True
        return self._usage(self._resident() + [footprint(snapshot)]) <= self.max_bytes

    def would_keep(self, fp: Footprint, kind: Kind, n_tokens: int) -> bool:
        """Would ``put`` keep a new entry of this footprint in memory? It is refused when it does not fit
        beside what eviction cannot remove first: the protected entry (unless the new one would take
        the protection over) and snapshots queued for the writer. Asked before a capture is taken."""
        if self.max_slots == 0 or fp.nbytes > self.max_bytes:
            return False
        members = [e for e in self._by_id.values() if e.in_memory]
        new = Entry("", np.zeros(int(n_tokens), dtype=np.int32), kind, True, fp.nbytes, mem=fp,
                    created=float("inf"), last_used=float("inf"))
        protected = self._protected(members + [new])
        stay = [e for e in members if e is protected or e.id in self._held]
        if len([e for e in stay if e is protected]) + 1 > self.max_slots:
            return False
        resident = [e.mem for e in stay] + [h for i, h in self._held.items() if not self._in_memory(i)]
        return self._usage(resident + [fp]) <= self.max_bytes

    def hold(self, entry_id: str, snapshot: Any) -> None:
        self._held[entry_id] = footprint(snapshot)
        self._mem_cache = None

    def release(self, entry_id: str) -> None:
        self._held.pop(entry_id, None)
        self._mem_cache = None

    def _in_memory(self, entry_id: str) -> bool:
        e = self._by_id.get(entry_id)
        return e is not None and e.in_memory

    # ---- updates ------------------------------------------------------------------------------

    def put(self, tokens: Sequence[int] | np.ndarray, kind: Kind, snapshot: Any) -> list[Eviction]:
        """Store a snapshot of the state after ``tokens`` in memory, then enforce the memory
        budgets. Putting tokens already indexed loads the snapshot into that entry (e.g. after a disk
        read) and upgrades a prompt_end entry to a prefix kind. The returned evictions may include
        this very entry (tier "memory") when it cannot fit."""
        fp = footprint(snapshot)
        entry = self._upsert(tokens, kind, fp.nbytes)
        if entry is None:
            return []
        entry.snapshot, entry.mem, entry.nbytes = snapshot, fp, fp.nbytes
        self._mem_cache = None
        return self._enforce("memory", entry)

    def put_disk(self, tokens: Sequence[int] | np.ndarray, kind: Kind, nbytes: int, disk_nbytes: int,
                 last_used: float | None = None, pages: Sequence[tuple[str, int]] = ()) -> list[Eviction]:
        """Record that a file for ``tokens`` exists (after a write, or from a start-up scan), then
        enforce the disk budgets. ``nbytes`` = the snapshot's whole size, ``disk_nbytes`` = the
        checkpoint file's size, ``pages`` = the page files it references, (name, bytes) each.
        ``last_used``: the recency recorded with the file (a start-up scan), instead of now."""
        entry = self._upsert(tokens, kind, nbytes, last_used)
        if entry is None:
            return []
        entry.on_disk = True
        entry.disk_nbytes = disk_nbytes
        entry.disk_pages = tuple((str(n), int(b)) for n, b in pages)
        return self._enforce("disk", entry)

    def touch(self, entry_id: str) -> Entry:
        """A restore from this entry: count a hit and make it most recently used."""
        e = self._by_id[entry_id]
        e.hits += 1
        e.last_used = self._clock()
        return e

    def record_prompt(self, prompt: Sequence[int] | np.ndarray) -> list[Entry]:
        """Call once per request: every stored prefix of ``prompt`` gains a share and becomes
        most recently used (it is in use even when the live state serves the request)."""
        found = self.prefixes_of(prompt)
        now = self._clock()
        for e in found:
            e.shares += 1
            e.last_used = now
        return found

    def remove(self, entry_id: str, tier: Tier | None = None) -> Entry | None:
        """Forget the snapshot (tier "memory"), the file (tier "disk"; the caller deletes it and the
        page files ``orphan_pages`` names), or the whole entry (tier None). Returns the entry, or
        None if unknown."""
        e = self._by_id.get(entry_id)
        if e is None:
            return None
        if tier in (None, "memory"):
            e.snapshot, e.mem = None, None
            self._mem_cache = None
        if tier in (None, "disk"):
            e.on_disk, e.disk_nbytes = False, 0
        if e.snapshot is None and not e.on_disk:
            del self._by_id[entry_id]
        return e

    def orphan_pages(self, pages: Sequence[tuple[str, int]]) -> tuple[str, ...]:
        """Of ``pages`` (an entry that left the disk tier), the page files no entry on disk references."""
        refs = self._disk_page_refs(self._by_id.values())
        return tuple(sorted({name for name, _ in pages if name not in refs}))

    def _remove_disk(self, e: Entry) -> tuple[bool, tuple[str, ...]]:
        pages = e.disk_pages
        self.remove(e.id, "disk")
        e.disk_pages = ()
        return e.id not in self._by_id, self.orphan_pages(pages)

    def evict_memory(self, nbytes: int, keep_pages: Collection[int] = (), spare: Collection[str] = ()
                     ) -> list[Eviction]:
        """Free at least ``nbytes`` of the memory tier if it can (a growing live state needs them; the
        memory guard): snapshots leave in the eviction order above, the protected entry last. Snapshots queued
        for the writer free nothing until written, so they stay. ``keep_pages``: page groups held outside
        the store (the live states'): they stay in memory whoever drops them, so they count as nothing
        freed — evicting a checkpoint that shares its groups with a live state frees only its tail.
        ``spare``: ids never evicted here (the checkpoint being restored). Returns what was evicted."""
        members = [e for e in self._by_id.values() if e.in_memory]
        protected = self._protected(members)
        ordinary = sorted((e for e in members if e is not protected),
                          key=lambda e: (e.kind not in TURN_ENDS, e.last_used, e.created, e.id))
        keep = frozenset(keep_pages)
        evicted: list[Eviction] = []
        start = self.memory_usage_beside(keep)
        for victim in ordinary + ([protected] if protected is not None else []):
            if start - self.memory_usage_beside(keep) >= nbytes:
                break
            if victim.id in self._held or victim.id in spare:
                continue
            self.remove(victim.id, "memory")
            evicted.append(Eviction(victim, "memory", victim.id not in self._by_id))
        return evicted

    def memory_usage_beside(self, keep_pages: Collection[int] = ()) -> int:
        """The memory tier's bytes, but for the page groups in ``keep_pages`` (held elsewhere too)."""
        total, pages, _ = self._memory()
        if not keep_pages:
            return total
        return total - sum(size for p, size in pages.items() if p in keep_pages)

    # ---- internals ----------------------------------------------------------------------------

    def _upsert(self, tokens: Sequence[int] | np.ndarray, kind: Kind, nbytes: int,
                last_used: float | None = None) -> Entry | None:
        if kind not in KINDS:
            raise ValueError(f"unknown checkpoint kind {kind!r}")
        ids = as_tokens(tokens).copy()
        ids.flags.writeable = False
        eid = prefix_hash(ids)
        now = self._clock() if last_used is None else last_used
        e = self._by_id.get(eid)
        if e is not None and not np.array_equal(e.tokens, ids):
            return None  # 64-bit hash collision: keep the incumbent, store nothing
        if e is None:
            e = Entry(eid, ids, kind, None, nbytes, created=now, last_used=now)
            self._by_id[eid] = e
        else:
            if (e.kind in TURN_ENDS and kind not in TURN_ENDS) or kind == "system":
                e.kind = kind
            e.last_used = max(e.last_used, now)   # a recency given by the caller never moves it back
        return e

    def _protected(self, members: list[Entry]) -> Entry | None:
        if not self.protect_system:
            return None
        for kind in ("system", "common"):
            pool = [e for e in members if e.kind == kind]
            if pool:
                return max(pool, key=lambda e: (e.shares * e.n_tokens, e.last_used, e.created, e.id))
        return None

    def _enforce(self, tier: Tier, newcomer: Entry) -> list[Eviction]:
        if tier == "memory":
            members = [e for e in self._by_id.values() if e.in_memory]
            max_slots, max_bytes, usage = self.max_slots, self.max_bytes, self.memory_usage
            whole = newcomer.mem.nbytes if newcomer.mem is not None else 0
            frees = lambda e: e.id not in self._held   # noqa: E731  a queued snapshot frees no bytes
        else:
            members = [e for e in self._by_id.values() if e.on_disk]
            max_slots = self.disk_max_slots if self.disk_max_slots is not None else len(members)
            max_bytes, usage = self.disk_max_bytes, self.disk_usage
            whole = newcomer.disk_nbytes + sum(b for _, b in set(newcomer.disk_pages))
            frees = lambda e: True   # noqa: E731
        protected = self._protected(members)
        ordinary = sorted((e for e in members if e is not newcomer and e is not protected),
                          key=lambda e: (e.kind not in TURN_ENDS, e.last_used, e.created, e.id))
        victims = ordinary + [newcomer] + ([protected] if protected not in (None, newcomer) else [])
        if whole > max_bytes or max_slots == 0:
            victims = [newcomer]  # can never fit: refuse it without disturbing the others
        count = len(members)
        evicted: list[Eviction] = []
        for victim in victims:
            if count <= max_slots and usage() <= max_bytes:
                break
            if count <= max_slots and not frees(victim) and victim is not newcomer:
                continue   # only bytes are over, and dropping this snapshot frees none (still queued)
            count -= 1
            if tier == "memory":
                self.remove(victim.id, "memory")
                evicted.append(Eviction(victim, tier, victim.id not in self._by_id))
            else:
                dropped, freed = self._remove_disk(victim)
                evicted.append(Eviction(victim, tier, dropped, freed))
        return evicted
