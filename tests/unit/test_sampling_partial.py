"""Token choice by partial selection: the same tokens as the full-sort sampler, without sorting the
whole vocabulary on the event loop (issue 10, item 5)."""

from __future__ import annotations

import numpy as np
import pytest

from cairn.actors.decoding import sampling
from cairn.actors.engine.messages import Sampling
from cairn.actors.decoding.sampling import choose


def choose_by_full_sort(logits, s: Sampling, rng) -> int:
    """The sampler as it was: a stable argsort of the whole vocabulary per token (the reference)."""
    x = np.asarray(logits, dtype=np.float64)
    if s.temperature <= 0.0 or s.top_k == 1:
        return int(np.argmax(x))
    x = x / s.temperature
    order = np.argsort(-x, kind="stable")
    if s.top_k > 0:
        order = order[: s.top_k]
    z = x[order]
    p = np.exp(z - z.max())
    p /= p.sum()
    if s.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(p), s.top_p) + 1)
        order, p = order[:keep], p[:keep] / p[:keep].sum()
    return int(order[rng.choice(len(order), p=p)])


def _rows(v: int, n: int, seed: int = 0) -> list[np.ndarray]:
    g = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        scale = (0.3, 1.0, 3.0, 8.0)[i % 4]               # flat to peaked distributions
        x = (g.standard_normal(v) * scale).astype(np.float32)
        if i % 3 == 0:
            x = np.round(x, 1)                             # many exact ties
        rows.append(x)
    return rows


SETTINGS = [Sampling(max_tokens=1, temperature=t, top_k=k, top_p=p)
            for t in (0.6, 1.0, 1.7) for k in (0, 2, 5, 40, 999, 1000, 5000) for p in (1.0, 0.95, 0.5, 0.05)]


@pytest.mark.parametrize("v", [1000, 50_000])
def test_partial_selection_samples_the_same_tokens_as_a_full_sort(v):
    rows = _rows(v, 8 if v > 1000 else 24)
    for s in SETTINGS if v == 1000 else SETTINGS[::5]:
        for i, x in enumerate(rows):
            a, b = np.random.default_rng(i), np.random.default_rng(i)
            got = [choose(x, s, a) for _ in range(4)]
            want = [choose_by_full_sort(x, s, b) for _ in range(4)]
            assert got == want, (s, i)
            assert a.bit_generator.state == b.bit_generator.state   # the same randomness consumed


def test_top_order_is_the_stable_sort_prefix_with_ties():
    from cairn.actors.decoding.sampling import top_order

    x = np.array([1.0, 3.0, 3.0, 2.0, 3.0, 2.0, 0.0])
    for k in range(1, 9):
        assert top_order(x, k).tolist() == np.argsort(-x, kind="stable")[:k].tolist()


def test_sampling_does_not_sort_the_whole_vocabulary(monkeypatch):
    v = 129_280
    sorted_sizes: list[int] = []
    real = np.argsort

    def spy(a, *args, **kw):
        sorted_sizes.append(np.asarray(a).shape[-1])
        return real(a, *args, **kw)

    monkeypatch.setattr(sampling.np, "argsort", spy)
    x = (np.random.default_rng(3).standard_normal(v) * 4).astype(np.float32)
    rng = np.random.default_rng(0)
    for s in (Sampling(max_tokens=1, temperature=0.8, top_k=50),
              Sampling(max_tokens=1, temperature=0.8, top_p=0.9),
              Sampling(max_tokens=1, temperature=0.8, top_k=40, top_p=0.95),
              Sampling(max_tokens=1, temperature=0.8)):
        choose(x, s, rng)
    assert sorted_sizes == [] or max(sorted_sizes) < v // 4


def test_nan_logits_fail_the_request_with_a_clear_error():
    x = np.zeros(100, np.float32)
    x[7] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        choose(x, Sampling(max_tokens=1, temperature=1.0, top_p=0.9), np.random.default_rng(0))
