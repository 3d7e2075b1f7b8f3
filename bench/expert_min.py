"""Belady's MIN for the routed-expert cache: the offline optimum's hit count on a route trace.

The trace is what `_kernel.replay_expert_policy` takes: `keys` (layer * E + expert, in access
order) and `steps` (the MoE call of each key, non-decreasing). The request sequence is the one the
replay sees: each call's distinct keys in order (a repeat within a call is no access), the cache
starts empty, and an access is a hit when its key is resident.

What may be evicted (`hold`) mirrors the kernel's call discipline:

- "release" (the default; the bound): only the key being acquired is safe. The kernel lets a call
  release its oldest held slots (FIFO, once their experts' outputs are done) whenever its policy
  finds no victim, so any earlier key of the call can be given up; hotpin does this whenever its
  unpinned slots are all busy, cycle whenever a held key is the better victim. Every kernel
  policy's run is then one schedule MIN chooses among: MIN >= lru, lrfu, hotpin and cycle on
  every trace.
- "call": a call's keys stay busy until the call ends, except that a call with more distinct keys
  than slots slides: acquiring its j-th key (j >= slots) releases its (j - slots)-th. This is what
  lru and lrfu are held to (they release only when every slot is busy), so MIN("call") bounds
  those two; hotpin releases earlier and can beat it (tests/unit/test_expert_min.py shows one).

Both are Belady's rule, evict the evictable key whose next use is furthest away, which is optimal
when the protected keys are fixed by the request sequence alone (every schedule must hold them);
tests check it against an exhaustive search. O(n log n): a next-use index and a lazy max-heap.
Plain, synchronous, imports nothing from the daemon or the kernel.
"""

from __future__ import annotations

import heapq
from collections import deque

import numpy as np

HOLDS = ("release", "call")


def requests(keys, steps) -> tuple[np.ndarray, np.ndarray]:
    """(keys, calls) of the accesses the replay counts: each call's distinct keys, first-seen order."""
    k = np.asarray(keys)
    s = np.asarray(steps)
    if k.ndim != 1 or s.ndim != 1:
        raise ValueError(f"keys and steps must be 1-D, got shapes {k.shape} and {s.shape}")
    if len(k) != len(s):
        raise ValueError(f"keys and steps must have the same length, got {len(k)} and {len(s)}")
    if len(k) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if not (np.issubdtype(k.dtype, np.integer) and np.issubdtype(s.dtype, np.integer)):
        raise ValueError(f"keys and steps must be integers, got {k.dtype} and {s.dtype}")
    k = k.astype(np.int64)
    s = s.astype(np.int64)
    neg = np.flatnonzero(k < 0)
    if len(neg):
        raise ValueError(f"keys[{neg[0]}] is negative ({k[neg[0]]}); keys are layer * E + expert >= 0")
    down = np.flatnonzero(np.diff(s) < 0)
    if len(down):
        raise ValueError(f"steps must be non-decreasing (at index {down[0] + 1})")
    # first occurrence of each (call, key) pair, kept in access order
    pair = np.stack([s, k], axis=1)
    _, first = np.unique(pair, axis=0, return_index=True)
    first.sort()
    return k[first], s[first]


def next_uses(keys: np.ndarray) -> np.ndarray:
    """next_uses[i]: index of the next request of keys[i], or len(keys) if none."""
    n = len(keys)
    nxt = np.full(n, n, np.int64)
    last: dict[int, int] = {}
    for i in range(n - 1, -1, -1):
        key = int(keys[i])
        nxt[i] = last.get(key, n)
        last[key] = i
    return nxt


def min_hits(keys, steps, slots: int, *, hold: str = "release") -> dict:
    """Belady's MIN on the trace with `slots` slots: dict(hits, misses, evictions)."""
    if isinstance(slots, bool) or not isinstance(slots, (int, np.integer)) or slots < 1:
        raise ValueError(f"slots must be an integer >= 1, got {slots!r}")
    if hold not in HOLDS:
        raise ValueError(f"hold must be one of {HOLDS}, got {hold!r}")
    slots = int(slots)
    rk, rc = requests(keys, steps)
    nxt = next_uses(rk)
    n = len(rk)
    # resident key -> its next use; the heap holds (-next_use, key) for evictable keys, stale
    # entries (next use changed, key evicted or now held) skipped when popped
    resident: dict[int, int] = {}
    heap: list[tuple[int, int]] = []
    held: deque[int] = deque()  # "call": this call's keys, oldest first (not in the heap meanwhile)
    hits = evictions = 0
    cur = None
    for i in range(n):
        key, call = int(rk[i]), int(rc[i])
        if call != cur:  # the previous call's held keys become evictable
            cur = call
            for h in held:
                heapq.heappush(heap, (-resident[h], h))
            held.clear()
        if hold == "call" and len(held) == slots:  # a full window slides: release the oldest
            h = held.popleft()
            heapq.heappush(heap, (-resident[h], h))
        if key in resident:
            hits += 1
        elif len(resident) == slots:
            while True:
                neg, victim = heapq.heappop(heap)
                if resident.get(victim) == -neg:  # held keys have no live entry
                    break
            del resident[victim]
            evictions += 1
        resident[key] = int(nxt[i])
        if hold == "call":
            held.append(key)
        else:
            heapq.heappush(heap, (-resident[key], key))
    return {"hits": hits, "misses": n - hits, "evictions": evictions}
