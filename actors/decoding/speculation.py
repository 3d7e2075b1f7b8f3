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
when it loses. Each request decides from its own acceptance: a verify call that fed d draft tokens
and kept a of them gave 1 + a tokens for the cost of 1 + d x c plain steps, where c, what one draft
token adds to a step, is the hardware's figure the decode worker measures for everyone (DecodeSteps:
steps with drafts against plain steps of the same batch size; DEFAULT_DRAFT_COST until it has both).
That call's gain is (1 + a) / (1 + d x c); when the recent gain falls below 1 the request decodes
plainly for a while (longer each time), then tries again. Nothing in it depends on what the other
requests of a batched step do, so a request whose drafts keep failing turns drafting off for
itself while one whose drafts are kept goes on — with one slot or several. c is kept within
[MIN_DRAFT_COST, 1]: a rejected draft is never free (its rows, its rewind), and a draft token
never costs more than a step of its own.
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
DEFAULT_DRAFT_COST = 0.25   # a draft token's cost in plain steps, before the decode worker has measured it
MIN_DRAFT_COST = 0.05


def draft_cost_of(call_s: float, plain_s: float, drafted: int) -> float:
    """What one draft token added to a step that fed `drafted` of them and took call_s, against
    plain_s for a plain step of the same batch size: in plain steps, within [MIN_DRAFT_COST, 1]."""
    if drafted <= 0 or plain_s <= 0:
        return DEFAULT_DRAFT_COST
    return min(1.0, max(MIN_DRAFT_COST, (call_s / plain_s - 1.0) / drafted))


@dataclass
class Speculation:
    """One request's drafting: its lookup over prompt and reply, the draft length, and auto-off."""
    lookup: PromptLookup
    k: int = FIRST_DRAFT
    gain: float | None = None           # moving average of tokens out per call / the call's cost in plain steps
    calls: int = 0                       # verify calls since drafting (re)started
    paused_for: int = 0                  # tokens left to decode plainly
    pause: int = FIRST_PAUSE
    # totals for the request's log line and the metrics
    # (no_room: drafts not sent, the memory plan had no room for them)
    stats: dict = field(default_factory=lambda: {"drafts": 0, "drafted": 0, "accepted": 0, "calls": 0, "off": 0,
                                                 "no_room": 0})

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

    def record(self, drafted: int, accepted: int, draft_cost: float = DEFAULT_DRAFT_COST) -> None:
        """One verify call fed `drafted` draft tokens (after its decoded token) and `accepted` of them
        were kept; a draft token costs `draft_cost` plain steps (the decode worker's figure)."""
        self.stats["drafts"] += 1
        self.stats["drafted"] += drafted
        self.stats["accepted"] += accepted
        self.k = min(MAX_DRAFT, 2 * self.k) if accepted == drafted else max(1, accepted + 1)
        c = min(1.0, max(MIN_DRAFT_COST, draft_cost))
        g = (1 + accepted) / (1 + drafted * c)
        self.gain = g if self.gain is None else (1 - GAIN_DECAY) * self.gain + GAIN_DECAY * g
        self.calls += 1
        if self.calls >= WARMUP_CALLS and self.gain < 1.0:   # drafting loses: decode plainly for a while
            self.paused_for, self.pause = self.pause, min(MAX_PAUSE, 2 * self.pause)
            self.gain, self.calls, self.k = None, 0, FIRST_DRAFT
            self.stats["off"] += 1
