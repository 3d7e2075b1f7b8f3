"""Pure: where does prefill start for a prompt, given the live state?

The single decision point of the prefill worker; the checkpoint planner (plan.py) replaces it
later with "extend the live state, restore the longest stored prefix, or start fresh".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True, slots=True)
class Start:
    fresh: bool        # True: discard the live state and begin from an empty State
    reuse: int         # prompt tokens already in the state (not recomputed)


def decide_start(live_tokens: Sequence[int] | None, live_has_logits: bool, prompt: Sequence[int],
                 *, need_all_logits: bool) -> Start:
    """Extend the live state when its tokens are a prefix of the prompt.

    - live tokens == prompt: reuse everything, but only if the state still holds the logits of its
      last position (otherwise there is nothing to sample from without recomputing).
    - live tokens a strict prefix of the prompt: prefill only the tail (this is also how an identical
      retry of a cancelled prefill resumes: the state kept its completed chunks).
    - anything else, or a request for every prompt position's logits: start fresh.
    """
    if need_all_logits or live_tokens is None:
        return Start(fresh=True, reuse=0)
    n = len(live_tokens)
    if n == 0 or n > len(prompt) or tuple(prompt[:n]) != tuple(live_tokens):
        return Start(fresh=True, reuse=0)
    if n == len(prompt) and not live_has_logits:
        return Start(fresh=True, reuse=0)
    return Start(fresh=False, reuse=n)
