"""One sequence slot of the engine: its live state and what it is doing, in one plain dataclass.

The engine holds N of them (N = `--slots`, 1 included). A slot keeps its live state between
requests, so a conversation that comes back extends it (slot_policy.py chooses). The workers read
and write these fields on the Trio thread only; the kernel thread touches `state` only inside a
kernel call the slot's own request made, so nothing here needs a lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .slot_policy import SlotView


@dataclass(eq=False)
class Sequence:
    index: int
    state: Any = None                  # kernel.State or None; remembers its tokens (state.tokens)
    request_id: str | None = None      # the request it serves (None: idle)
    prompt_tokens: int = 0             # that request's prompt length (shortest-remaining-first)
    phase: str = "idle"                # idle | prefill | decode
    last_used: float = 0.0             # trio time it last finished a request (0: never)

    def tokens_left(self) -> int:
        """Prompt tokens its prefill still has to compute (the kernel gate's priority)."""
        done = 0 if self.state is None else int(self.state.n_tokens)
        return max(0, self.prompt_tokens - done)

    def view(self) -> SlotView:
        busy = self.request_id is not None
        tokens = None
        # A busy slot's state may be in the kernel thread right now: its tokens are not read (nor needed).
        if not busy and self.state is not None and self.state.last_logits is not None:
            tokens = np.asarray(self.state.tokens, dtype=np.int32)
        return SlotView(self.index, busy, tokens, self.last_used)

    def describe(self) -> dict:
        """What the slot holds and does (/v1/status, `cairn status`)."""
        return {"slot": self.index, "request_id": self.request_id, "phase": self.phase,
                "state_tokens": 0 if self.state is None else int(self.state.n_tokens)}
