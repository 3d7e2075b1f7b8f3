"""Exact speculative decoding, per request: how long a draft to send, and when to stop drafting.

How it stays exact. A decoded token and its draft are fed in one kernel call (`verify`), which
gives every row's logits, the same bits as decoding them one by one. The decode loop then picks
each next token from those rows exactly as it would without drafts (the same shaping, grammar mask
and sampling, the same random draws in the same order); a draft token is kept while it equals the
token picked, and the rest is rewound (`rewind`, an exact undo in the kernel). So the output is the
one plain decoding gives, greedy or sampled, seed for seed. For sampling this is standard
speculative sampling with a one-hot draft distribution q = [d]: accepting d with probability
min(1, p(d)/q(d)) = p(d), else drawing from the residual max(0, p - q) (p without d, renormalised),
is the same as drawing from p and keeping d when the draw is d.

The policy (this module, no trio): the draft length adapts (doubles after a fully accepted draft,
shrinks to what was accepted plus one after a rejection), and drafting turns off for the request
when it loses: each verify call's tokens out, against the time a plain decode step takes, is a gain;
when the recent gain falls below 1 the request decodes plainly for a while (longer each time), then
tries again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from .drafts import PromptLookup

FIRST_DRAFT = 4        # draft length at the start and after a pause
MAX_DRAFT = 16
GAIN_DECAY = 0.3       # weight of the newest call in the gain's moving average
WARMUP_CALLS = 3       # calls before the gain may turn drafting off
FIRST_PAUSE = 16       # plain tokens after the first loss; doubles with each further loss
MAX_PAUSE = 512


@dataclass
class Speculation:
    """One request's drafting: its lookup over prompt and reply, the draft length, and auto-off."""
    lookup: PromptLookup
    k: int = FIRST_DRAFT
    gain: float | None = None           # moving average of tokens per call x plain step / call time
    calls: int = 0                       # verify calls since drafting (re)started
    paused_for: int = 0                  # tokens left to decode plainly
    pause: int = FIRST_PAUSE
    # totals for the request's log line and the metrics
    stats: dict = field(default_factory=lambda: {"drafts": 0, "drafted": 0, "accepted": 0, "calls": 0, "off": 0})

    @classmethod
    def over(cls, prompt: Iterable[int]) -> "Speculation":
        return cls(PromptLookup(prompt))

    def push(self, token: int) -> None:
        """A token of the reply (picked, whether it was drafted or not)."""
        self.lookup.append(token)
        if self.paused_for > 0:
            self.paused_for -= 1

    def draft(self, room: int) -> list[int]:
        """The draft to feed after the last pushed token; at most `room` tokens (what the reply may
        still hold after it), [] while paused or when nothing matches."""
        if self.paused_for > 0 or room <= 0:
            return []
        return self.lookup.draft(min(self.k, room))

    def record(self, drafted: int, accepted: int, call_s: float, plain_s: float | None) -> None:
        """One verify call fed `drafted` draft tokens (after its decoded token) and `accepted` of them
        were kept; it took call_s, against plain_s for a plain decode step (None: not measured yet)."""
        self.stats["drafts"] += 1
        self.stats["drafted"] += drafted
        self.stats["accepted"] += accepted
        self.k = min(MAX_DRAFT, 2 * self.k) if accepted == drafted else max(1, accepted + 1)
        if plain_s is None or call_s <= 0:
            return
        g = (1 + accepted) * plain_s / call_s
        self.gain = g if self.gain is None else (1 - GAIN_DECAY) * self.gain + GAIN_DECAY * g
        self.calls += 1
        if self.calls >= WARMUP_CALLS and self.gain < 1.0:   # drafting loses: decode plainly for a while
            self.paused_for, self.pause = self.pause, min(MAX_PAUSE, 2 * self.pause)
            self.gain, self.calls, self.k = None, 0, FIRST_DRAFT
            self.stats["off"] += 1
