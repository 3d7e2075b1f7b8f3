"""Pure logit adjustments before sampling: logit_bias, presence and frequency penalties, banned ids.

OpenAI's definitions: for each token j, logit[j] += bias[j] - count[j] * frequency_penalty -
(count[j] > 0) * presence_penalty, where count[j] is how often j was generated so far in this reply
(the prompt does not count, as in vLLM). Kept apart from sampling.py (top-k/top-p) on purpose.
"""

from __future__ import annotations

import numpy as np

from ..engine.messages import Sampling


def active(s: Sampling) -> bool:
    return bool(s.logit_bias) or bool(s.banned) or s.presence_penalty != 0.0 or s.frequency_penalty != 0.0


class Penalties:
    """Counts generated tokens and applies the request's penalties and biases to a logits row."""

    def __init__(self, s: Sampling, vocab_size: int) -> None:
        self.s = s
        self.counts: dict[int, int] = {}
        ids = [t for t, _ in s.logit_bias if t < vocab_size]
        self._bias_ids = np.asarray(ids, dtype=np.int64)
        self._bias = np.asarray([b for t, b in s.logit_bias if t < vocab_size], dtype=np.float64)
        self._banned = np.asarray([t for t in s.banned if t < vocab_size], dtype=np.int64)

    def apply(self, logits: np.ndarray) -> np.ndarray:
        x = np.array(logits, dtype=np.float64)          # a copy: the model's own logits stay untouched
        if self._bias_ids.size:
            x[self._bias_ids] += self._bias
        if self.counts and (self.s.presence_penalty or self.s.frequency_penalty):
            ids = np.fromiter(self.counts.keys(), dtype=np.int64, count=len(self.counts))
            n = np.fromiter(self.counts.values(), dtype=np.float64, count=len(self.counts))
            x[ids] -= n * self.s.frequency_penalty + self.s.presence_penalty
        if self._banned.size:
            x[self._banned] = -np.inf                   # last: no bias or penalty brings them back
        return x

    def accept(self, token_id: int) -> None:
        self.counts[token_id] = self.counts.get(token_id, 0) + 1


class Shaper:
    """What decode applies to the model's logits before choosing: penalties, biases, a grammar mask.
    The mask comes from the request's constraint (daemon/protocol/constrain.py), computed by the caller in a
    worker thread; this class stays pure."""

    def __init__(self, s: Sampling, vocab_size: int) -> None:
        self.penalties = Penalties(s, vocab_size) if active(s) else None
        self.constraint = s.constraint

    def shape(self, logits: np.ndarray, allowed: np.ndarray | None) -> np.ndarray:
        x = self.penalties.apply(logits) if self.penalties is not None else logits
        if allowed is not None and allowed.any():
            x = np.where(allowed[: x.shape[-1]], np.asarray(x, dtype=np.float64), -np.inf)
        return x

    def accept(self, token_id: int) -> None:
        if self.penalties is not None:
            self.penalties.accept(token_id)
        if self.constraint is not None:
            self.constraint.accept(token_id)
