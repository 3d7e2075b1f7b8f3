"""actors/engine/prefill.py: what a prefill keeps alive after a segment (issue 10, item 7)."""

from __future__ import annotations

import numpy as np

import fake_kernel
from cairn.actors.engine.prefill import _prefill_with_logprobs


def test_prompt_logprobs_segment_keeps_a_copy_of_the_last_logits_row_not_the_whole_block():
    model = fake_kernel.Model(vocab_size=64)
    state = fake_kernel.State(model)
    tokens = np.arange(1, 41, dtype=np.int32)
    n_done, last, lps, _ = _prefill_with_logprobs(fake_kernel, state, tokens, None, 2, chunk=16, abort=None)
    assert n_done == 40 and len(lps) == 40
    assert last.shape == (64,) and last.base is None          # owns its 256 B, not a view of [40, 64]
    np.testing.assert_array_equal(last, state.last_logits)


# --- the memory plan's estimates against what the real kernel allocates (issue 40 §3) -------------------

import ctypes  # noqa: E402
import gc  # noqa: E402

import pytest  # noqa: E402

from cairn.daemon.service.memory_plan import StateCost  # noqa: E402


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]


def heap_bytes() -> int:
    """Bytes malloc has handed out and not taken back, every arena (the kernel threads' too) and
    every mmapped block: what the C++ vectors and page groups hold."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    gc.collect()
    m = libc.mallinfo2()
    return int(m.uordblks + m.hblkhd)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from daemon_harness import real_loaded

    loaded = real_loaded(tiny_model_dir, threads=1)
    from cairn.daemon.weights.model_dir import open_model_dir

    return loaded.kernel, loaded.model, StateCost.from_config(open_model_dir(tiny_model_dir).config,
                                                             int(loaded.model.page_tokens))


def _prompt(n: int) -> np.ndarray:
    return (np.arange(n, dtype=np.int32) * 7919 + 11) % 500 + 3


@pytest.mark.parametrize("n", [5, 300, 2000])
def test_a_live_state_holds_no_more_than_the_plan_counts(tiny, n):
    """resident_at(n) >= what a live state of n tokens allocates: its full-size window ring and
    compressor buffers (even at 5 tokens), its page groups (the last one whole), ids and logits."""
    kernel, model, cost = tiny
    warm = kernel.State(model)
    kernel.prefill(warm, _prompt(n), chunk=64)    # the kernel threads' scratch, allocated once
    del warm
    before = heap_bytes()
    st = kernel.State(model)
    kernel.prefill(st, _prompt(n), chunk=64)
    measured = heap_bytes() - before
    assert int(st.n_tokens) == n
    assert cost.resident_at(n) >= measured, (n, cost.resident_at(n), measured)


@pytest.mark.parametrize("n", [5, 300, 2000])
def test_a_snapshot_holds_no_more_than_the_plan_counts_for_a_checkpoint(tiny, n):
    """snapshot_bytes_at(n) (a checkpoint's estimate) >= what a snapshot allocates and what it reports (its own
    bytes plus its page groups; the last group whole): a snapshot copies only the prefixes its tokens use."""
    kernel, model, cost = tiny
    st = kernel.State(model)
    kernel.prefill(st, _prompt(n), chunk=64)
    before = heap_bytes()
    snap = st.snapshot(share_pages=False)          # every group copied too: the whole checkpoint
    measured = heap_bytes() - before
    assert cost.snapshot_bytes_at(n) >= max(measured, int(snap.nbytes)), (n, cost.snapshot_bytes_at(n), measured)


def test_a_verify_keeps_no_more_than_the_plan_counts_for_its_journal(tiny):
    """journal_bytes(S) >= what a verify of S tokens leaves in its state until the next call (the undo
    record, about 1 MB a draft token at V4-Flash width), with the state's own growth counted apart."""
    kernel, model, cost = tiny
    s = 17
    warm = kernel.State(model)
    kernel.prefill(warm, _prompt(300), chunk=64)
    kernel.verify(warm, _prompt(s))
    del warm
    st = kernel.State(model)
    kernel.prefill(st, _prompt(300), chunk=64)     # 300 + 17 tokens stay inside one page group
    before = heap_bytes()
    out = kernel.verify(st, _prompt(s))
    del out
    measured = heap_bytes() - before
    growth = cost.resident_at(300 + s) - cost.resident_at(300)
    assert cost.journal_bytes(s) + growth >= measured, (cost.journal_bytes(s), growth, measured)
    assert measured > s * 4 * cost.vocab                  # it did keep the logits of every fed token
    if hasattr(model, "verify_journal_nbytes"):           # the kernel's own figure, where it has one
        assert cost.journal_bytes(s) >= int(model.verify_journal_nbytes(s))
