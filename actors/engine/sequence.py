"""One sequence slot of the engine: its live state and what it is doing, in one plain dataclass.

The engine holds N of them (N = `--slots`, 1 included). A slot keeps its live state between
requests, so a conversation that comes back extends it (slot_policy.py chooses). The workers read
and write these fields on the Trio thread only; the kernel thread touches `state` only inside a
kernel call the slot's own request made.

Design notes: a state is never read while it may be busy. Another slot's request, the memory guard
and `GET /v1/status` must not call a state's getters: a kernel call on it may be running with the
GIL released (the kernel refuses such a read, and before it did, the read raced the call's writes).
They read `figures` instead: a frozen `StateFigures` published in the kernel thread at the end of
every kernel call (Engine wires `KernelRunner.publish` to `publish`; calls never overlap, so no
state is busy then) and whenever `state` is set (a new, restored or dropped state is in no call).
A lock makes "which state" and "its figures" change together, so a slow publish can never give one
state's figures to the state that replaced it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .slot_policy import SlotView


@dataclass(frozen=True, slots=True)
class StateFigures:
    """What the rest of the daemon may know about a live state without touching it (the same names as
    the kernel State's getters, so a reader takes either)."""
    n_tokens: int = 0
    page_ids: tuple[int, ...] = ()     # its page groups of compressed rows (shared with checkpoints)
    page_nbytes: int = 0
    tail_nbytes: int = 0               # bytes a snapshot would copy (everything outside page groups)
    has_logits: bool = False           # it can be extended or sampled from (a prefill completed)

    @classmethod
    def of(cls, state: Any) -> "StateFigures":
        """Read `state` (the caller guarantees no kernel call holds it)."""
        if state is None:
            return cls()
        return cls(int(state.n_tokens), tuple(int(p) for p in state.page_ids), int(state.page_nbytes),
                   int(state.tail_nbytes), state.last_logits is not None)


NO_STATE = StateFigures()


@dataclass(eq=False)
class Sequence:
    index: int
    request_id: str | None = None      # the request it serves (None: idle)
    prompt_tokens: int = 0             # that request's prompt length (shortest-remaining-first)
    phase: str = "idle"                # idle | prefill | decode
    last_used: float = 0.0             # trio time it last finished a request (0: never)
    _state: Any = field(default=None, repr=False)             # kernel.State or None
    _figures: StateFigures = field(default=NO_STATE, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def state(self) -> Any:
        return self._state

    @state.setter
    def state(self, state: Any) -> None:
        """Set only with a state no kernel call holds (new, restored, or None)."""
        with self._lock:
            self._state, self._figures = state, StateFigures.of(state)

    @property
    def figures(self) -> StateFigures:
        """The state's figures as of the end of its last kernel call (NO_STATE without a state)."""
        return self._figures

    def publish(self) -> None:
        """In the kernel thread, right after a kernel call returned: no call holds any state now."""
        with self._lock:
            if self._state is not None:
                self._figures = StateFigures.of(self._state)

    def tokens_left(self) -> int:
        """Prompt tokens its prefill still has to compute (the kernel gate's priority)."""
        return max(0, self.prompt_tokens - self.figures.n_tokens)

    def view(self) -> SlotView:
        busy = self.request_id is not None
        tokens = None
        # A busy slot's state may be in the kernel thread right now: its tokens are not read (nor needed);
        # an idle one's request has ended after its last kernel call returned.
        if not busy and self.state is not None and self.figures.has_logits:
            tokens = np.asarray(self.state.tokens, dtype=np.int32)
        return SlotView(self.index, busy, tokens, self.last_used)

    def describe(self) -> dict:
        """What the slot holds and does (/v1/status, `cairn status`)."""
        return {"slot": self.index, "request_id": self.request_id, "phase": self.phase,
                "state_tokens": self.figures.n_tokens}
