"""Pure admission policy: up to `slots` requests run (one per live state), others wait FIFO in a
bounded queue.

A running request keeps its admission until `release()` — which the actor calls only when a
worker reports the kernel has stopped and that request's live state is consistent.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class AdmissionQueue(Generic[T]):
    def __init__(self, capacity: int, slots: int = 1) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.capacity = capacity           # requests that may wait (not counting the running ones)
        self.slots = slots                 # requests that may run at once
        self._waiting: deque[tuple[str, T]] = deque()
        self._running: list[str] = []

    def __len__(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> tuple[str, ...]:
        return tuple(self._running)

    def can_accept(self) -> bool:
        return len(self._running) < self.slots or len(self._waiting) < self.capacity

    def offer(self, key: str, item: T) -> bool:
        """Queue `item`; False when the queue is full."""
        if not self.can_accept():
            return False
        self._waiting.append((key, item))
        return True

    def remove(self, key: str) -> T | None:
        """Take a waiting request out of the queue (it was cancelled); None if it is not waiting."""
        for i, (k, item) in enumerate(self._waiting):
            if k == key:
                del self._waiting[i]
                return item
        return None

    def admit_next(self) -> tuple[str, T] | None:
        """The next request to run, if a slot is free and someone waits."""
        if len(self._running) >= self.slots or not self._waiting:
            return None
        key, item = self._waiting.popleft()
        self._running.append(key)
        return key, item

    def release(self, key: str) -> None:
        if key in self._running:
            self._running.remove(key)
