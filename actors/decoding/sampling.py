"""Pure token choice: log-probabilities, top-k / top-p / temperature sampling, greedy.

No trio. A request owns one seeded `numpy.random.Generator`, so a seeded request repeats exactly.
Log-probabilities reported to clients are the model's own (before temperature / top-k / top-p), as
OpenAI and vLLM report them.
"""

from __future__ import annotations

import numpy as np

from ..engine.messages import Sampling


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """[..., V] float32 -> [..., V] float64 log-probabilities."""
    x = np.asarray(logits, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def top_logprobs(logprobs: np.ndarray, k: int) -> tuple[tuple[int, float], ...]:
    """The k most likely tokens of one [V] row, best first; ties broken by lower id."""
    if k <= 0:
        return ()
    k = min(k, logprobs.shape[-1])
    idx = np.argpartition(-logprobs, k - 1)[:k]
    idx = idx[np.lexsort((idx, -logprobs[idx]))]
    return tuple((int(i), float(logprobs[i])) for i in idx)


def make_rng(seed: int | None) -> np.random.Generator:
    return np.random.default_rng(seed)


def top_order(x: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest values of a [V] row, best first, ties to the lower id: exactly
    `np.argsort(-x, kind="stable")[:k]`, by partial selection (O(V) plus a sort of k)."""
    v = x.shape[0]
    if k >= v:
        return np.argsort(-x, kind="stable")
    kth = np.partition(x, v - k)[v - k]                  # the k-th largest value
    above = np.flatnonzero(x > kth)
    ties = np.flatnonzero(x == kth)[: k - above.shape[0]]  # at the boundary, the lowest ids (stable sort)
    cand = np.concatenate((above, ties))
    return cand[np.lexsort((cand, -x[cand]))]


FIRST_CANDIDATES = 64     # top-p / plain sampling: the best-first prefix tried first, then x4 until enough


def choose(logits: np.ndarray, s: Sampling, rng: np.random.Generator) -> int:
    """Next token id from one [V] row of logits.

    The draw is the one `rng.choice` makes over the candidates sorted best first (stable): one
    `rng.random()` u, the first candidate whose normalised cumulative mass exceeds u. Sorting the
    whole vocabulary for it (~10 ms at V = 129k) is avoided by partial selection: top-k takes the k
    best (then the same arithmetic as a full sort, bit for bit); top-p and plain sampling take a
    best-first prefix of growing size until it holds the top-p mass, or the mass that u points
    into. Only sums over the whole vocabulary are taken in id order rather than sorted order (a
    difference in the last bits, tests/unit/test_sampling_partial.py).
    """
    if s.temperature <= 0.0 or s.top_k == 1:
        # float32 -> float64 is exact, so the row's own argmax is the same id, without a [V] copy
        return int(np.argmax(logits))
    x = np.asarray(logits, dtype=np.float64)
    x = x / s.temperature
    v = x.shape[0]
    if not np.isfinite(x.max()):
        raise ValueError("sampling: the logits contain NaN or infinity")
    if 0 < s.top_k < v:
        order = top_order(x, s.top_k)
        z = x[order]
        p = np.exp(z - z[0])
        p /= p.sum()
        if s.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(p), s.top_p) + 1)  # smallest set with mass >= top_p
            order, p = order[:keep], p[:keep] / p[:keep].sum()
        return int(order[_draw(p, rng.random())])
    # No top-k: probabilities over the whole vocabulary, then a best-first prefix that is long enough.
    e = np.exp(x - x.max())
    e /= e.sum()
    u = None if s.top_p < 1.0 else rng.random()
    m = FIRST_CANDIDATES
    while True:
        order = top_order(x, m)
        c = np.cumsum(e[order])
        whole = order.shape[0] >= v
        if s.top_p < 1.0:
            if c[-1] >= s.top_p or whole:
                keep = int(np.searchsorted(c, s.top_p) + 1)
                p = e[order[:keep]]
                return int(order[_draw(p / p.sum(), rng.random())])
        elif whole or c[-1] > u * (1 + 1e-9):   # margin: the full sum's rounding may still move the cut
            return int(order[_draw(e[order] if whole else None, u, cdf=None if whole else c)])
        m *= 4


def _draw(p: np.ndarray | None, u: float, cdf: np.ndarray | None = None) -> int:
    """`rng.choice(len(p), p=p)` given its uniform u: the first index whose cumulative mass exceeds u."""
    if cdf is None:
        cdf = np.cumsum(p)
        cdf /= cdf[-1]
    return int(np.searchsorted(cdf, u, side="right"))
