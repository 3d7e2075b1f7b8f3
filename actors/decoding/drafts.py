"""Prompt-lookup drafts: guess the next tokens from what the conversation already holds.

Agents' replies repeat what they were shown (a file rewritten with a few changes, a diff, a
command echoed back). The draft is what followed the latest earlier occurrence of the longest
suffix of the text so far (an n-gram of MAX_NGRAM down to MIN_NGRAM tokens), searched over the
prompt and the reply. No second model; the kernel verifies the draft (actors/decoding/speculation.py).

Design notes. The history is one int32 array (capacity doubling: at most 8 bytes a token, where
dicts of n-gram tuples took ~416: 53 MB at 128k tokens; the memory plan counts
LOOKUP_BYTES_PER_TOKEN). A draft scans it once, vectorised: the positions holding the last token,
then, among those few, the ones whose preceding tokens match the suffix one more at a time. O(n)
a draft in numpy (~0.1 ms at 128k tokens, against a decode step of tens of milliseconds), O(1)
amortised a token appended.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

MAX_NGRAM = 4
MIN_NGRAM = 2
LOOKUP_BYTES_PER_TOKEN = 8    # the history array at its worst just after doubling (int32, capacity <= 2x)


class PromptLookup:
    def __init__(self, tokens: Iterable[int] = (), *, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"n-gram lengths must satisfy 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self._h = np.zeros(16, dtype=np.int32)    # (capacity,) the history; the first _n are used
        self._n = 0
        self.extend(tokens)

    @property
    def tokens(self) -> list[int]:
        """The history so far (a copy)."""
        return self._h[:self._n].tolist()

    @property
    def nbytes(self) -> int:
        return int(self._h.nbytes)

    def __len__(self) -> int:
        return self._n

    def _room(self, extra: int) -> None:
        need = self._n + extra
        if need > self._h.shape[0]:
            grown = np.zeros(max(need, 2 * self._h.shape[0]), dtype=np.int32)
            grown[:self._n] = self._h[:self._n]
            self._h = grown

    def append(self, token: int) -> None:
        self._room(1)
        self._h[self._n] = int(token)
        self._n += 1

    def extend(self, tokens: Iterable[int]) -> None:
        ids = np.asarray(tokens if isinstance(tokens, (np.ndarray, list, tuple)) else list(tokens), dtype=np.int32)
        ids = ids.reshape(-1)
        self._room(ids.shape[0])
        self._h[self._n:self._n + ids.shape[0]] = ids
        self._n += ids.shape[0]

    def draft(self, k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix
        (longest first, so a long match wins over a recent short one); [] when none matches."""
        n = self._n
        if k <= 0 or n < max(2, self.min_ngram):
            return []
        h = self._h[:n]
        # ends[i]: where an earlier occurrence of the suffix ends (it has a follower: end <= n - 2)
        ends = np.flatnonzero(h[:n - 1] == h[n - 1])
        best = -1
        for g in range(1, min(self.max_ngram, n) + 1):
            if g > 1:
                ends = ends[ends >= g - 1]
                ends = ends[h[ends - (g - 1)] == h[n - g]]
            if ends.shape[0] == 0:
                break
            if g >= self.min_ngram:
                best = int(ends[-1])       # the latest occurrence of the longest suffix so far
        if best < 0:
            return []
        return h[best + 1:best + 1 + k].tolist()


def longest_match(history: Sequence[int], k: int, *, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> list[int]:
    """The same draft by a plain scan (the reference the tests compare PromptLookup with)."""
    h = list(history)
    for n in range(min(max_ngram, len(h)), min_ngram - 1, -1):
        suffix = h[len(h) - n:]
        for start in range(len(h) - n - 1, -1, -1):      # latest earlier occurrence with a follower
            if h[start:start + n] == suffix:
                return h[start + n:start + n + k]
    return []
