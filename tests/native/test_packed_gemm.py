"""The packed-panel GEMM every weight matrix runs on: right answers for awkward shapes, and each
output depends only on its own input row and weight row (not on the batch, the thread split or
the K blocking) -- the property that makes a token's numbers independent of its chunk."""

import numpy as np
import pytest

import cairn._kernel as K

# M: 1 (decode), below / above the 6-row tile; N: not a multiple of the 16-row panel; K: not a
# multiple of the 512-wide K block, and several blocks.
SHAPES = [(1, 16, 64), (5, 17, 100), (7, 33, 513), (40, 250, 1100), (130, 64, 2049)]


@pytest.mark.parametrize("m, n, k", SHAPES)
def test_matches_float64_reference(m, n, k):
    rng = np.random.default_rng(m * 1000 + n)
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32)
    y, _ = K._packed_matmul(x, w, 2)
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    # fp32 sequential FMA chain over k: error grows ~ sqrt(k) ulps of the magnitudes summed
    bound = 1e-6 * np.sqrt(k) * (np.abs(x).astype(np.float64) @ np.abs(w).T.astype(np.float64))
    assert y.shape == (m, n) and y.dtype == np.float32
    assert np.all(np.abs(y - ref) <= bound)


@pytest.mark.parametrize("m, n, k", SHAPES[1:])
def test_row_results_do_not_depend_on_batch_or_threads(m, n, k):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32)
    whole, _ = K._packed_matmul(x, w, 2)
    one_thread, _ = K._packed_matmul(x, w, 1)
    rows = np.concatenate([K._packed_matmul(x[i : i + 1], w, 1)[0] for i in range(m)])
    np.testing.assert_array_equal(whole, one_thread)
    np.testing.assert_array_equal(whole, rows)


def test_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="x \\[M, K\\], w \\[N, K\\]"):
        K._packed_matmul(np.zeros((2, 3), np.float32), np.zeros((4, 5), np.float32), 1)
    with pytest.raises(ValueError, match="reps"):
        K._packed_matmul(np.zeros((2, 3), np.float32), np.zeros((4, 3), np.float32), 1, 0)
