"""Pure slot choice: which live state a new request runs in (several conversations at once).

A slot's live state can only be extended, never cut back, so a slot is reusable for a prompt when
its tokens are a prefix of the prompt (and it holds next-token logits). The choice, among idle
slots only:
1. the slot whose live tokens are the longest such prefix (the least to compute);
2. else the least recently used idle slot — an empty one first — whose state the prefill plan then
   replaces (a checkpoint restore, or fresh). Keeping the most recently used states alive keeps
   the conversations most likely to come back next.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True, slots=True)
class SlotView:
    index: int
    busy: bool
    tokens: np.ndarray | None      # int32 [n] live tokens (None: no usable state)
    last_used: float               # trio time the slot last finished a request (0: never)


@dataclass(frozen=True, slots=True)
class SlotChoice:
    index: int
    shared: int                    # live tokens the prompt extends (0: the plan replaces the state)


def shared_prefix(live: np.ndarray | None, prompt: np.ndarray) -> int:
    """len(live) when live is a non-empty prefix of prompt, else 0."""
    if live is None or len(live) == 0 or len(live) > len(prompt):
        return 0
    return len(live) if np.array_equal(prompt[: len(live)], live) else 0


def choose_slot(slots: Sequence[SlotView], prompt: np.ndarray) -> SlotChoice | None:
    """The idle slot for `prompt`; None when every slot is busy."""
    idle = [s for s in slots if not s.busy]
    if not idle:
        return None
    best = max(idle, key=lambda s: (shared_prefix(s.tokens, prompt), -s.index))
    n = shared_prefix(best.tokens, prompt)
    if n > 0:
        return SlotChoice(best.index, n)
    empty_first = min(idle, key=lambda s: (s.tokens is not None and len(s.tokens) > 0, s.last_used, s.index))
    return SlotChoice(empty_first.index, 0)
