"""Pure token choice: log-probabilities, top-k / top-p / temperature sampling, greedy.

No trio. A request owns one seeded `numpy.random.Generator`, so a seeded request repeats exactly.
Log-probabilities reported to clients are the model's own (before temperature / top-k / top-p), as
OpenAI and vLLM report them.
"""

from __future__ import annotations

import numpy as np

from .messages import Sampling


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


def choose(logits: np.ndarray, s: Sampling, rng: np.random.Generator) -> int:
    """Next token id from one [V] row of logits."""
    x = np.asarray(logits, dtype=np.float64)
    if s.temperature <= 0.0 or s.top_k == 1:
        return int(np.argmax(x))
    x = x / s.temperature
    order = np.argsort(-x, kind="stable")                 # [V] best first
    if s.top_k > 0:
        order = order[: s.top_k]
    z = x[order]
    p = np.exp(z - z.max())
    p /= p.sum()
    if s.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(p), s.top_p) + 1)  # smallest set with mass >= top_p
        order, p = order[:keep], p[:keep] / p[:keep].sum()
    return int(order[rng.choice(len(order), p=p)])
