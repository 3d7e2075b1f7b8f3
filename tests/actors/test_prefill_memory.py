"""actors/prefill.py: what a prefill keeps alive after a segment (issue 10, item 7)."""

from __future__ import annotations

import numpy as np

import fake_kernel
from cairn.actors.prefill import _prefill_with_logprobs


def test_prompt_logprobs_segment_keeps_a_copy_of_the_last_logits_row_not_the_whole_block():
    model = fake_kernel.Model(vocab_size=64)
    state = fake_kernel.State(model)
    tokens = np.arange(1, 41, dtype=np.int32)
    n_done, last, lps, _ = _prefill_with_logprobs(fake_kernel, state, tokens, None, 2, chunk=16, abort=None)
    assert n_done == 40 and len(lps) == 40
    assert last.shape == (64,) and last.base is None          # owns its 256 B, not a view of [40, 64]
    np.testing.assert_array_equal(last, state.last_logits)
