"""Who runs the kernel next: the decode worker's step or a prefill chunk (Engine.run).

Policy: a decode step first (it advances every decoding sequence at once, and a stream's next
token should wait for at most the one kernel call already running); then the prefill with the
fewest prompt tokens left — shortest remaining first, so a short side request (a title, a tool's
sub-question) is not stuck behind a long prompt: it waits one chunk, not the whole prefill. Ties go
first come, first served. A long prefill can only be starved by an endless stream of shorter ones,
and it still gets every other turn while others decode (a decode step is requested again only
after its tokens are sampled, when the gate has already passed to the prefill).

Every kernel call holds the gate for its duration; with several slots a call is one prefill chunk
or one decode step, which bounds how long anyone waits (with one slot a prefill call is a segment:
there is nobody else to wait).
"""

from __future__ import annotations

import heapq
import itertools
from contextlib import asynccontextmanager
from typing import AsyncIterator

import trio

DECODE = (0, 0)


def prefill_priority(tokens_left: int) -> tuple[int, int]:
    return (1, max(0, int(tokens_left)))


class KernelGate:
    def __init__(self) -> None:
        self._busy = False
        self._waiters: list[tuple[tuple[int, int], int, trio.Event]] = []
        self._seq = itertools.count()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def free(self) -> bool:
        """Nobody holds the gate or waits for it: `hold` takes it without waiting."""
        return not self._busy and not self._waiters

    @asynccontextmanager
    async def hold(self, priority: tuple[int, int]) -> AsyncIterator[None]:
        await self._acquire(priority)
        try:
            yield
        finally:
            self._release(now=priority == DECODE)

    async def _acquire(self, priority: tuple[int, int]) -> None:
        if not self._busy and not self._waiters:
            await trio.lowlevel.checkpoint_if_cancelled()
            self._busy = True           # no await after the check: a cancel cannot leave it held
            return
        entry = (priority, next(self._seq), trio.Event())
        heapq.heappush(self._waiters, entry)
        try:
            await entry[2].wait()
        except trio.Cancelled:
            if entry[2].is_set():     # granted as we were cancelled: pass it on
                self._release()
            else:
                self._waiters.remove(entry)
                heapq.heapify(self._waiters)
            raise

    def _release(self, now: bool = False) -> None:
        if not self._waiters:
            self._busy = False
            return
        if now:
            # A decode step hands over at once: its sequences ask again only once their tokens are
            # sampled, and a lone sequence does that in the releasing task, without a yield (decode.py);
            # a deferred choice would see that request, the highest priority, and starve the prefill.
            self._grant()
            return
        # Choose after the releasing task has run on: a prefill asks again for its next chunk
        # without waiting for anything, and must compete with its own priority -- handing the
        # kernel to the only waiter at once would make prefills alternate (round robin) instead of
        # shortest first. The gate stays held until the choice, so nobody slips past the queue.
        trio.lowlevel.current_trio_token().run_sync_soon(self._grant)

    def _grant(self) -> None:
        if self._waiters:
            heapq.heappop(self._waiters)[2].set()   # ownership passes to the best waiter
        else:                                        # they all left (cancelled) meanwhile
            self._busy = False
