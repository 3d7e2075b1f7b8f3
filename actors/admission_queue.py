"""Pure admission policy: one request runs, others wait FIFO in a bounded queue.

The running request keeps its admission until `release()` — which the actor calls only when a
worker reports the kernel has stopped and the live state is consistent.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class AdmissionQueue(Generic[T]):
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity           # requests that may wait (not counting the running one)
        self._waiting: deque[tuple[str, T]] = deque()
        self.running: str | None = None

    def __len__(self) -> int:
        return len(self._waiting)

    def can_accept(self) -> bool:
        return self.running is None or len(self._waiting) < self.capacity

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
        """The next request to run, if the engine is free and someone waits."""
        if self.running is not None or not self._waiting:
            return None
        key, item = self._waiting.popleft()
        self.running = key
        return key, item

    def release(self, key: str) -> None:
        if self.running == key:
            self.running = None
