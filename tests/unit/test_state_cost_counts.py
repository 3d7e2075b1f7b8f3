"""StateCost sums its per-layer terms as counts times one layer's term (the decode path asks per token,
issue 41 §5): the same integers as the per-layer loop it replaced, kept here as the reference."""

from __future__ import annotations

import random

from cairn.daemon.service.memory_plan import BOOKKEEPING_PER_LAYER, STATE_SLACK, StateCost, _comp_floats

S, C, H = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"


def _loop_resident_at(c: StateCost, n: int) -> int:
    floats = used = fixed = rows = 0
    for kind in c.layer_types:
        floats += min(n, c.window - 1) * c.head_dim
        used += min(n, c.window - 1) * c.head_dim
        fixed += max(0, c.window - 1) * c.head_dim
        if kind == C:
            for dim in (c.head_dim, c.index_head_dim):
                floats += _comp_floats(c.csa_rate, dim, True, n)
                used += _comp_floats(c.csa_rate, dim, True, n) - (n // c.csa_rate) * dim
                fixed += 2 * c.csa_rate * 2 * dim + 2 * c.csa_rate * dim
            rows += (c.page_tokens // c.csa_rate) * (c.head_dim + c.index_head_dim)
        elif kind == H:
            floats += _comp_floats(c.hca_rate, c.head_dim, False, n)
            used += _comp_floats(c.hca_rate, c.head_dim, False, n) - (n // c.hca_rate) * c.head_dim
            fixed += 2 * c.hca_rate * c.head_dim
            rows += (c.page_tokens // c.hca_rate) * c.head_dim
    group = 4 * rows if c.page_tokens > 0 else 0
    bytes_at = 4 * floats + 4 * n + 4 * c.vocab
    return int(bytes_at * STATE_SLACK) + 4 * max(0, fixed - used) + group + BOOKKEEPING_PER_LAYER * len(c.layer_types)


def test_resident_at_is_the_per_layer_sum():
    rng = random.Random(0)
    for _ in range(200):
        layers = tuple(rng.choice((S, C, H)) for _ in range(rng.randint(1, 45)))
        c = StateCost(layers, rng.choice((16, 24, 128)), rng.choice((32, 64, 512)), rng.choice((16, 64, 128)), 4,
                      rng.choice((16, 128)), rng.choice((512, 129280)), rng.choice((0, 256, 512)))
        for n in (0, 1, 15, 16, 17, 127, 128, 129, 4097, 131072, rng.randint(0, 1 << 20)):
            assert c.resident_at(n) == _loop_resident_at(c, n), (c, n)
