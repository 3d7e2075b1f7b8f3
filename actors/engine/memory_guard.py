"""The memory guard: before a kernel call grows a state, make sure the memory plan has room for it.

Design notes.
 * The plan (daemon/service/memory_plan.py) is fixed at start: live states and checkpoint memory share
   `pool_bytes`. A slot's share is only a planning figure; a state may grow past it while the others
   leave room. `reserve(state, n)` is the one call the engine makes before each prefill call or decode
   step that adds n tokens to `state`: it adds up every live state (this one after the growth, as
   StateCost.resident_at) and the checkpoint store's memory (snapshots queued for the writer
   included) and compares with the pool. Live states and checkpoints share page groups
   (docs/prefill.md "Pages"): a group is counted once, whoever holds it — each state's page groups
   are replaced in its figure by the union of every holder's groups.
 * States are read only through their slot's published figures (sequence.StateFigures, set at the
   end of each kernel call): another slot's call may be writing a state right now.
 * Over the pool, room is made in this order: checkpoints leave memory (the store's eviction order:
   prompt-end captures first, the protected system prefix last) until this count has room or none is
   left — the store is told which page groups live states hold, so a checkpoint sharing them with a
   live state frees only its tail — then idle slots' live states (a cache of a finished
   conversation, rebuilt by a prefill). `try_reserve` makes room the same way but answers False
   (a draft is optional); `hold` keeps bytes outside any state for a `with` block (a restore), and
   when even evicting every checkpoint but the restored one and every idle state could not make its
   room it evicts nothing (the restore is skipped; the caches stay for the requests that fit). If that is still not enough the request
   ends with `MemoryExceeded` (lifecycle.py turns it into an HTTP 507 `insufficient_memory` reply);
   the other requests go on and the OOM killer never has to choose.
 * A capture is refused before the snapshot is taken when its blob could not be kept: larger than the
   checkpoint budget (the store would refuse it) or than the plan's transient room (the copy itself
   would not fit) — `capture_refusal`.
 * Synchronous and on the Trio thread (the store needs no lock); the kernel thread never calls it.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


class MemoryExceeded(RuntimeError):
    """A state cannot grow within the memory plan, even after evicting checkpoints."""


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


class MemoryGuard:
    def __init__(self, plan, engine, *, log=None, metrics=None) -> None:
        self.plan = plan
        self.engine = engine              # actors.engine.engine.Engine: its live state(s) and checkpoint store
        self.log = log
        self.metrics = metrics
        self.refused = 0                  # requests ended for memory
        self.held = 0                     # bytes held outside states and checkpoints (`hold`: restores)

    # ---- what is in use ---------------------------------------------------------------------------

    def _live(self) -> list:
        """The sequence.Sequence of every live state. Read through its published figures only: a state
        may be in a kernel call right now (sequence.py)."""
        return [s for s in self.engine.slots if s.state is not None]

    def _slot_of(self, state):
        for s in self.engine.slots:
            if s.state is state:
                return s
        raise ValueError("memory guard: the state is not a live state of this engine's slots")

    def _resident(self, n_tokens: int) -> int:
        cost = self.plan.state_cost
        return cost.resident_at(n_tokens) if cost is not None else 0

    def _in_use(self, live: list, grow=None, grow_to: int = 0) -> int:
        """Bytes of the `live` sequences' states (`grow`'s at grow_to tokens), the checkpoints and what
        is held, each page group once."""
        store = self.engine.checkpoints.store
        pages = store.memory_pages()
        total = store.memory_own_bytes() + self.held
        for seq in live:
            fig = seq.figures
            n = grow_to if seq is grow else fig.n_tokens
            total += max(0, self._resident(n) - len(fig.page_ids) * fig.page_nbytes)   # its tail, groups to come
            pages.update(dict.fromkeys(fig.page_ids, fig.page_nbytes))
        return total + sum(pages.values())

    @staticmethod
    def _live_pages(live: list) -> frozenset:
        """Page groups the live states hold: evicting a checkpoint does not free those."""
        return frozenset(p for seq in live for p in seq.figures.page_ids)

    def usage(self) -> dict:
        """Bytes in use now (for /v1/status): live states, checkpoint memory, the pool."""
        live = self._live()
        states = sum(self._resident(s.figures.n_tokens) for s in live)
        ck = self.engine.checkpoints.store.memory_usage()
        return {"states_bytes": states, "checkpoint_bytes": ck, "pool_bytes": self.plan.pool_bytes,
                "held_bytes": self.held, "refused": self.refused,
                "captures_skipped": self.engine.checkpoints.captures_skipped,
                "pool_in_use_bytes": self._in_use(live)}

    # ---- the hook ----------------------------------------------------------------------------------

    def reserve(self, state, n_tokens: int, request_id: str = "") -> None:
        """Room for `state` to hold n_tokens more, or MemoryExceeded. Evicts checkpoints (then idle
        live states) when that makes the room."""
        why = self._room(self._slot_of(state), n_tokens, 0, request_id)
        if why is None:
            return
        self.refused += 1
        if self.metrics is not None:
            self.metrics.memory_refused.inc()
        if self.log is not None:
            self.log.warning("memory_exceeded", request_id=request_id, **why[1])
        raise MemoryExceeded(why[0])

    def try_reserve(self, state, n_tokens: int, request_id: str = "") -> bool:
        """Like `reserve` (room is made the same way), but False instead of MemoryExceeded, and a
        refusal is not counted: for growth the caller can do without (a draft to verify)."""
        return self._room(self._slot_of(state), n_tokens, 0, request_id) is None

    @contextmanager
    def hold(self, nbytes: int, request_id: str = "", spare: tuple[str, ...] = ()) -> Iterator[bool]:
        """Room for `nbytes` outside any state or checkpoint for the `with` block (a restore's read
        buffers and copies): yields True and counts them as in use until the block ends, or yields
        False (no room even after evicting) and holds nothing. `spare`: checkpoint ids not evicted
        for it (the one being restored)."""
        ok = self._room(None, 0, max(0, int(nbytes)), request_id, spare) is None
        if ok:
            self.held += max(0, int(nbytes))
        try:
            yield ok
        finally:
            if ok:
                self.held -= max(0, int(nbytes))

    def _room(self, seq, n_tokens: int, extra: int, request_id: str, spare: tuple[str, ...] = ()
              ) -> tuple[str, dict] | None:
        """Make room for `seq`'s state to hold n_tokens more and `extra` bytes beside it: None when
        there is, else (message, log fields)."""
        pool = self.plan.pool_bytes
        if pool is None or self.plan.state_cost is None or (n_tokens <= 0 and extra <= 0):
            return None
        live = self._live()
        after = (seq.figures.n_tokens if seq is not None else 0) + max(0, int(n_tokens))
        mine = self._resident(after) if seq is not None else 0

        def total() -> int:
            return self._in_use(live, seq, after) + extra

        # Counting shared groups twice only overestimates: when even that fits (the common case, every
        # decode step) the exact union is not needed.
        store = self.engine.checkpoints.store
        if (mine + sum(self._resident(s.figures.n_tokens) for s in live if s is not seq) + store.memory_usage()
                + self.held + extra) <= pool:
            return None
        if seq is None and self._floor(live, seq, after, extra, spare) > pool:
            # a hold (a restore) no eviction can make room for: evict nothing for it, the caller does without
            return self._refusal(live, seq, after, mine, extra, pool, 0)
        over = total() - pool
        freed = 0
        # Checkpoints first, until there is room by this exact count or none is left: a checkpoint's
        # pages that a live state also holds free nothing, so the store is told which those are.
        while over > 0:
            got = self.engine.checkpoints.make_room(over, request_id, keep_pages=self._live_pages(live),
                                                    spare=spare)
            if got <= 0:
                break
            freed += got
            over = total() - pool
        dropped = 0
        for other in [s for s in live if s is not seq]:
            if over <= 0:
                break
            if other.request_id is None:    # idle: a cache of a finished conversation
                n_other = other.figures.n_tokens
                self.engine.discard(other)
                live.remove(other)
                dropped += 1
                over = total() - pool     # what it frees: its tail and the groups nobody else holds
                if self.log is not None:
                    self.log.info("memory_live_state_dropped", request_id=request_id, slot=other.index,
                                  tokens=n_other, bytes=self._resident(n_other), reason="room for a growing state")
        if over <= 0:
            if self.log is not None and (freed or dropped):
                self.log.info("memory_room_made", request_id=request_id, state_tokens=after, held_bytes=extra,
                              checkpoint_bytes_freed=freed, idle_states_dropped=dropped)
            return None
        return self._refusal(live, seq, after, mine, extra, pool, freed)

    def _floor(self, live: list, seq, after: int, extra: int, spare: tuple[str, ...]) -> int:
        """The least _in_use + extra could fall to by evicting: every checkpoint gone but `spare`, every
        idle live state dropped. Over the pool, evicting would only destroy caches for a refusal anyway."""
        store = self.engine.checkpoints.store
        pages: dict[int, int] = {}
        total = self.held + extra
        for eid in spare:
            e = store.get(eid)
            if e is not None and e.mem is not None:
                total += e.mem.own
                pages.update(dict.fromkeys(e.mem.pages, e.mem.page_nbytes))
        for s in live:
            if s is seq or s.request_id is not None:
                fig = s.figures
                n = after if s is seq else fig.n_tokens
                total += max(0, self._resident(n) - len(fig.page_ids) * fig.page_nbytes)
                pages.update(dict.fromkeys(fig.page_ids, fig.page_nbytes))
        return total + sum(pages.values())

    def _refusal(self, live: list, seq, after: int, mine: int, extra: int, pool: int, freed: int
                 ) -> tuple[str, dict]:
        store = self.engine.checkpoints.store
        states_now = sum(self._resident(s.figures.n_tokens) for s in live if s is not seq)
        ck = store.memory_usage()
        what = (f"this conversation's state would grow to {after} tokens ({_mib(mine)})" if seq is not None
                else f"a checkpoint restore needs {_mib(extra)} while it reads and copies")
        msg = (f"memory: {what}; with the other live states ({_mib(states_now)}) and checkpoints still in memory "
               f"({_mib(ck)}) that passes the {_mib(pool)} the memory plan leaves for states and checkpoints "
               f"(limit: {self.plan.limit_source}); {_mib(freed)} of checkpoints were evicted first. Shorten "
               "the conversation, or give the daemon more memory")
        return msg, dict(state_tokens=after, state_bytes=mine, other_states_bytes=states_now, checkpoint_bytes=ck,
                         held_bytes=self.held + extra, pool_bytes=pool, checkpoint_bytes_freed=freed,
                         limit=self.plan.limit_source)

    def capture_refusal(self, nbytes: int) -> str | None:
        """Why a snapshot of `nbytes` must not be taken (None: take it)."""
        if self.plan.room_bytes is not None and nbytes > self.plan.transient_bytes:
            return (f"snapshot of {_mib(nbytes)} is larger than the memory plan's room for a capture's copy "
                    f"({_mib(self.plan.transient_bytes)})")
        return None
