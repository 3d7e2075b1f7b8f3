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
 * Over the pool, room is made in this order: checkpoints leave memory (the store's eviction order:
   prompt-end captures first, the protected system prefix last), then idle slots' live states (a
   cache of a finished conversation, rebuilt by a prefill). If that is still not enough the request
   ends with `MemoryExceeded` (lifecycle.py turns it into an HTTP 507 `insufficient_memory` reply);
   the other requests go on and the OOM killer never has to choose.
 * A capture is refused before the snapshot is taken when its blob could not be kept: larger than the
   checkpoint budget (the store would refuse it) or than the plan's transient room (the copy itself
   would not fit) — `capture_refusal`.
 * Synchronous and on the Trio thread (the store needs no lock); the kernel thread never calls it.
"""

from __future__ import annotations

from typing import Any


class MemoryExceeded(RuntimeError):
    """A state cannot grow within the memory plan, even after evicting checkpoints."""


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


class MemoryGuard:
    def __init__(self, plan, engine, *, log=None, metrics=None) -> None:
        self.plan = plan
        self.engine = engine              # actors.engine.Engine: its live state(s) and checkpoint store
        self.log = log
        self.metrics = metrics
        self.refused = 0                  # requests ended for memory

    # ---- what is in use ---------------------------------------------------------------------------

    def _states(self) -> list[tuple[Any, Any]]:
        """(state, its sequence.Sequence) of every live state."""
        return [(s.state, s) for s in self.engine.slots if s.state is not None]

    def _resident(self, n_tokens: int) -> int:
        cost = self.plan.state_cost
        return cost.resident_at(n_tokens) if cost is not None else 0

    def _in_use(self, states: list, grow=None, grow_to: int = 0) -> int:
        """Bytes of `states` (`grow` at grow_to tokens) and the checkpoints, each page group once."""
        store = self.engine.checkpoints.store
        pages = store.memory_pages()
        total = store.memory_own_bytes()
        for st in states:
            n = grow_to if st is grow else int(st.n_tokens)
            ids = [int(p) for p in st.page_ids]
            nb = int(st.page_nbytes)
            total += max(0, self._resident(n) - len(ids) * nb)   # its tail and the groups it will add
            pages.update(dict.fromkeys(ids, nb))
        return total + sum(pages.values())

    def usage(self) -> dict:
        """Bytes in use now (for /v1/status): live states, checkpoint memory, the pool."""
        states = sum(self._resident(int(st.n_tokens)) for st, _ in self._states())
        ck = self.engine.checkpoints.store.memory_usage()
        return {"states_bytes": states, "checkpoint_bytes": ck, "pool_bytes": self.plan.pool_bytes,
                "refused": self.refused, "captures_skipped": self.engine.checkpoints.captures_skipped,
                "pool_in_use_bytes": self._in_use([st for st, _ in self._states()])}

    # ---- the hook ----------------------------------------------------------------------------------

    def reserve(self, state, n_tokens: int, request_id: str = "") -> None:
        """Room for `state` to hold n_tokens more, or MemoryExceeded. Evicts checkpoints (then idle
        live states) when that makes the room."""
        why = self._room(state, n_tokens, request_id)
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
        return self._room(state, n_tokens, request_id) is None

    def _room(self, state, n_tokens: int, request_id: str) -> tuple[str, dict] | None:
        """Make room for `state` to hold n_tokens more: None when there is, else (message, log fields)."""
        pool = self.plan.pool_bytes
        if pool is None or self.plan.state_cost is None or n_tokens <= 0:
            return None
        after = int(state.n_tokens) + int(n_tokens)
        others = [(st, slot) for st, slot in self._states() if st is not state]
        mine = self._resident(after)

        def total() -> int:
            return self._in_use([state] + [st for st, _ in others], state, after)

        # Counting shared groups twice only overestimates: when even that fits (the common case, every
        # decode step) the exact union is not needed.
        store = self.engine.checkpoints.store
        if (self._resident(after) + sum(self._resident(int(st.n_tokens)) for st, _ in others)
                + store.memory_usage()) <= pool:
            return None
        over = total() - pool
        if over <= 0:
            return None
        freed = self.engine.checkpoints.make_room(over, request_id)
        over = total() - pool
        dropped = 0
        for st, slot in list(others):
            if over <= 0:
                break
            if slot.request_id is None:    # idle: a cache of a finished conversation
                size = self._resident(int(st.n_tokens))
                self.engine.discard(slot)
                others.remove((st, slot))
                dropped += 1
                over = total() - pool     # what it frees: its tail and the groups nobody else holds
                if self.log is not None:
                    self.log.info("memory_live_state_dropped", request_id=request_id, slot=slot.index,
                                  tokens=int(st.n_tokens), bytes=size, reason="room for a growing state")
        if over <= 0:
            if self.log is not None:
                self.log.info("memory_room_made", request_id=request_id, state_tokens=after,
                              checkpoint_bytes_freed=freed, idle_states_dropped=dropped)
            return None
        states_now = sum(self._resident(int(st.n_tokens)) for st, _ in others)
        ck = self.engine.checkpoints.store.memory_usage()
        msg = (f"memory: this conversation's state would grow to {after} tokens ({_mib(mine)}); with the other "
               f"live states ({_mib(states_now)}) and checkpoints still in memory ({_mib(ck)}) that passes the "
               f"{_mib(pool)} the memory plan leaves for states and checkpoints (limit: {self.plan.limit_source}); "
               f"{_mib(freed)} of checkpoints were evicted first. Shorten the conversation, or give the daemon "
               "more memory")
        return msg, dict(state_tokens=after, state_bytes=mine, other_states_bytes=states_now, checkpoint_bytes=ck,
                         pool_bytes=pool, checkpoint_bytes_freed=freed, limit=self.plan.limit_source)

    def capture_refusal(self, nbytes: int) -> str | None:
        """Why a snapshot of `nbytes` must not be taken (None: take it)."""
        if self.plan.room_bytes is not None and nbytes > self.plan.transient_bytes:
            return (f"snapshot of {_mib(nbytes)} is larger than the memory plan's room for a capture's copy "
                    f"({_mib(self.plan.transient_bytes)})")
        return None
