"""The prefix-checkpoint index: lookup by token-id prefix, two budgeted tiers, eviction order.

Pure policy: no I/O, no threads, no trio. Snapshot blobs are opaque bytes; files are named by the
entry id (``disk_format.file_name``) and written / deleted by the caller, told what to do by the
``Eviction`` records that ``put`` / ``put_disk`` return.

Design notes
 * Key = the exact token ids. The id is ``prefix_hash(tokens)`` (blake2b-64 of int32 LE ids);
   a lookup hashes the prompt's prefixes at the few stored lengths (one incremental pass) and
   then compares the ids, so a hash collision can never restore the wrong state.
 * Two tiers, each with a slot budget and a byte budget:
     memory: entries whose blob is loaded; counts ``nbytes`` (the blob);
     disk:   entries with a file; counts ``disk_nbytes`` (the file). Off when disk_max_bytes == 0.
   An entry may be in both. ``tier`` is "memory" when the blob is loaded, else "disk".
 * Eviction, per tier, runs while the tier is over either budget. Victims in order:
     1. prompt_end captures, least recently used first;
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
 * Blobs queued for the disk writer (``hold`` / ``release``) count against the memory byte budget
   until written, also after their entry left memory: the budget bounds everything the store holds
   or has queued. Evicting a held entry frees a slot but no bytes: it is evicted only for a slot,
   eviction for bytes passes over it; ``can_hold`` tells the caller whether one more queued blob fits.
 * Recency uses an injected clock (default: a counter ticking once per operation), so tests are
   deterministic.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import numpy as np

from .disk_format import KINDS, as_tokens, prefix_hash

Kind = Literal["system", "common", "prompt_end"]
Tier = Literal["memory", "disk"]


@dataclass(slots=True, eq=False)
class Entry:
    """One stored prefix. Owned by the store: read it, do not mutate it."""

    id: str                 # prefix_hash(tokens), 16 hex digits; also the file stem
    tokens: np.ndarray      # (n_tokens,) int32, read-only
    kind: str               # "system" | "common" | "prompt_end"
    blob: bytes | None      # the snapshot; None when only on disk (not loaded)
    nbytes: int             # blob size (known from the header for disk-only entries)
    on_disk: bool = False
    disk_nbytes: int = 0    # file size when on_disk
    hits: int = 0           # restores served (touch)
    shares: int = 1         # requests whose prompt started with these tokens (record_prompt)
    created: float = 0
    last_used: float = 0

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def in_memory(self) -> bool:
        return self.blob is not None

    @property
    def tier(self) -> Tier:
        return "memory" if self.blob is not None else "disk"

    def __repr__(self) -> str:
        where = "+".join(t for t, on in (("memory", self.in_memory), ("disk", self.on_disk)) if on)
        return (f"Entry({self.id} {self.kind} n={self.n_tokens} {where} {self.nbytes}B "
                f"hits={self.hits} shares={self.shares} used={self.last_used})")


@dataclass(frozen=True, slots=True)
class Eviction:
    """``entry`` left ``tier``. tier "memory": its blob was dropped. tier "disk": the caller must
    delete its file. ``dropped``: the entry is no longer indexed at all."""

    entry: Entry
    tier: Tier
    dropped: bool


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


class CheckpointStore:
    def __init__(self, *, max_slots: int = 4, max_bytes: int = 1 << 30,
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
        self._held: dict[str, int] = {}   # entry id -> bytes of a blob queued for the disk writer

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
        return StoreStats(len(mem), sum(e.nbytes for e in mem), len(disk), sum(e.disk_nbytes for e in disk),
                          kinds, sum(e.hits for e in self._by_id.values()), self.protected_id,
                          self.queued_bytes)

    # ---- blobs held outside the store (queued for the disk writer) ------------------------------

    def is_held(self, entry_id: str) -> bool:
        return entry_id in self._held

    @property
    def queued_bytes(self) -> int:
        """Bytes held for the writer whose entry is not in memory (else counted there already)."""
        return sum(n for i, n in self._held.items() if not self._in_memory(i))

    def memory_usage(self) -> int:
        """What the memory byte budget bounds: loaded blobs plus queued ones."""
        return sum(e.nbytes for e in self._by_id.values() if e.in_memory) + self.queued_bytes

    def can_hold(self, entry_id: str, nbytes: int) -> bool:
        """Would queueing a blob of ``nbytes`` for ``entry_id`` keep the memory budget?"""
        extra = 0 if self._in_memory(entry_id) or entry_id in self._held else nbytes
        return self.memory_usage() + extra <= self.max_bytes

    def hold(self, entry_id: str, nbytes: int) -> None:
        self._held[entry_id] = nbytes

    def release(self, entry_id: str) -> None:
        self._held.pop(entry_id, None)

    def _in_memory(self, entry_id: str) -> bool:
        e = self._by_id.get(entry_id)
        return e is not None and e.in_memory

    # ---- updates ------------------------------------------------------------------------------

    def put(self, tokens: Sequence[int] | np.ndarray, kind: Kind, blob: bytes) -> list[Eviction]:
        """Store a snapshot of the state after ``tokens`` in memory, then enforce the memory
        budgets. Putting tokens already indexed loads the blob into that entry (e.g. after a disk
        read) and upgrades a prompt_end entry to a prefix kind. The returned evictions may include
        this very entry (tier "memory") when it cannot fit."""
        entry = self._upsert(tokens, kind, len(blob))
        if entry is None:
            return []
        entry.blob = blob
        entry.nbytes = len(blob)
        return self._enforce("memory", entry)

    def put_disk(self, tokens: Sequence[int] | np.ndarray, kind: Kind, nbytes: int, disk_nbytes: int,
                 last_used: float | None = None) -> list[Eviction]:
        """Record that a file for ``tokens`` exists (after a write, or from a start-up scan), then
        enforce the disk budgets. ``nbytes`` = payload (blob) size, ``disk_nbytes`` = file size.
        ``last_used``: the recency recorded with the file (a start-up scan), instead of now."""
        entry = self._upsert(tokens, kind, nbytes, last_used)
        if entry is None:
            return []
        entry.on_disk = True
        entry.disk_nbytes = disk_nbytes
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
        """Forget the blob (tier "memory"), the file (tier "disk"; the caller deletes it), or the
        whole entry (tier None). Returns the entry, or None if unknown."""
        e = self._by_id.get(entry_id)
        if e is None:
            return None
        if tier in (None, "memory"):
            e.blob = None
        if tier in (None, "disk"):
            e.on_disk, e.disk_nbytes = False, 0
        if e.blob is None and not e.on_disk:
            del self._by_id[entry_id]
        return e

    def evict_memory(self, nbytes: int) -> list[Eviction]:
        """Free at least ``nbytes`` of the memory tier if it can (a growing live state needs them; the
        memory guard): blobs leave in the eviction order above, the protected entry last. Blobs queued
        for the writer free nothing until written, so they stay. Returns what was evicted."""
        members = [e for e in self._by_id.values() if e.in_memory]
        protected = self._protected(members)
        ordinary = sorted((e for e in members if e is not protected),
                          key=lambda e: (e.kind != "prompt_end", e.last_used, e.created, e.id))
        evicted: list[Eviction] = []
        freed = 0
        for victim in ordinary + ([protected] if protected is not None else []):
            if freed >= nbytes:
                break
            if victim.id in self._held:
                continue
            freed += victim.nbytes
            self.remove(victim.id, "memory")
            evicted.append(Eviction(victim, "memory", victim.id not in self._by_id))
        return evicted

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
            if (e.kind == "prompt_end" and kind != "prompt_end") or kind == "system":
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
            max_slots, max_bytes = self.max_slots, self.max_bytes
            held = self._held
            size = lambda e: 0 if e.id in held else e.nbytes   # noqa: E731  what evicting it frees
            extra = self.queued_bytes
        else:
            members = [e for e in self._by_id.values() if e.on_disk]
            max_slots = self.disk_max_slots if self.disk_max_slots is not None else len(members)
            max_bytes, size, extra = self.disk_max_bytes, (lambda e: e.disk_nbytes), 0
        protected = self._protected(members)
        ordinary = sorted((e for e in members if e is not newcomer and e is not protected),
                          key=lambda e: (e.kind != "prompt_end", e.last_used, e.created, e.id))
        victims = ordinary + [newcomer] + ([protected] if protected not in (None, newcomer) else [])
        full = (lambda e: e.nbytes) if tier == "memory" else size
        if full(newcomer) > max_bytes or max_slots == 0:
            victims = [newcomer]  # can never fit: refuse it without disturbing the others
        count, total = len(members), sum(full(e) for e in members) + extra
        evicted: list[Eviction] = []
        for victim in victims:
            if count <= max_slots and total <= max_bytes:
                break
            if count <= max_slots and size(victim) == 0 and victim is not newcomer:
                continue   # only bytes are over, and dropping this blob frees none (still queued)
            count -= 1
            total -= size(victim)
            self.remove(victim.id, tier)
            evicted.append(Eviction(victim, tier, victim.id not in self._by_id))
        return evicted
