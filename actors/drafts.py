"""Prompt-lookup drafts: guess the next tokens from what the conversation already holds.

Agents' replies repeat what they were shown (a file rewritten with a few changes, a diff, a
command echoed back). The draft is what followed the latest earlier occurrence of the longest
suffix of the text so far (an n-gram of MAX_NGRAM down to MIN_NGRAM tokens), searched over the
prompt and the reply. No second model; the kernel verifies the draft (actors/speculation.py).

Lookup is a dict per n-gram length from the n-gram to the index right after its latest
occurrence, kept as tokens arrive: O(1) a token, O(n) in bulk over a prompt of n tokens.
"""

from __future__ import annotations

from typing import Iterable, Sequence

MAX_NGRAM = 4
MIN_NGRAM = 2


class PromptLookup:
    def __init__(self, tokens: Iterable[int] = (), *, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"n-gram lengths must satisfy 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.tokens: list[int] = []
        self._next: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_ngram, max_ngram + 1)}
        self.extend(tokens)

    def append(self, token: int) -> None:
        t = len(self.tokens)
        h = self.tokens
        # The n-grams ending just before the new token now have a follower: it is at index t.
        for n, table in self._next.items():
            if t >= n:
                table[tuple(h[t - n:t])] = t
        h.append(int(token))

    def extend(self, tokens: Iterable[int]) -> None:
        """append() of each token, in bulk: the n-grams come from zips of slices, the dict updates in C
        (a 128k-token prompt in well under a second, where a loop of append() takes seconds)."""
        h = self.tokens
        t0 = len(h)
        h.extend(int(t) for t in tokens)
        for n, table in self._next.items():
            first = max(n, t0)               # followers t in [first, len(h)): n-gram h[t-n:t]
            if first >= len(h):
                continue
            grams = zip(*(h[first - n + i:len(h) - n + i] for i in range(n)))
            table.update(zip(grams, range(first, len(h))))

    def draft(self, k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix
        (longest first, so a long match wins over a recent short one); [] when none matches."""
        h = self.tokens
        if k <= 0:
            return []
        for n in range(min(self.max_ngram, len(h)), self.min_ngram - 1, -1):
            j = self._next[n].get(tuple(h[len(h) - n:]))
            if j is not None:
                return h[j:j + k]
        return []


def longest_match(history: Sequence[int], k: int, *, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> list[int]:
    """The same draft by a plain scan (the reference the tests compare PromptLookup with)."""
    h = list(history)
    for n in range(min(max_ngram, len(h)), min_ngram - 1, -1):
        suffix = h[len(h) - n:]
        for start in range(len(h) - n - 1, -1, -1):      # latest earlier occurrence with a follower
            if h[start:start + n] == suffix:
                return h[start + n:start + n + k]
    return []
