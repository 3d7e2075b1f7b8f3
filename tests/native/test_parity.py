"""Kernel vs HF DeepseekV4ForCausalLM (fp32): every position, every chunking, greedy decode."""

import numpy as np
import pytest

import cairn._kernel as K

from hf_oracle import LONG_LEN, LONG_TAIL, N_DECODE, PROMPT_LEN

TOL = 1e-4


@pytest.mark.parametrize("chunk", [1, 7, 37, 128])
def test_prefill_all_positions_match_hf(oracle, chunk):
    st = K.State(oracle.model())
    n, logits = K.prefill(st, oracle.tokens, chunk=chunk, all_logits=True)
    assert n == len(oracle.tokens)
    assert logits.shape == oracle.ref_logits.shape and logits.dtype == np.float32
    diff = np.abs(logits - oracle.ref_logits).max(axis=1)
    assert diff.max() <= TOL, f"max |dlogit| {diff.max():.3g} first at position {int(np.argmax(diff > TOL))}"
    assert (logits.argmax(1) == oracle.ref_logits.argmax(1)).all()
    np.testing.assert_array_equal(st.last_logits, logits[-1])


def test_prefill_then_greedy_decode_matches_hf(oracle):
    st = K.State(oracle.model())
    n, logits = K.prefill(st, oracle.tokens[:PROMPT_LEN], chunk=128)
    assert n == PROMPT_LEN
    assert np.abs(logits - oracle.ref_logits[PROMPT_LEN - 1]).max() <= TOL
    got = []
    for i in range(N_DECODE):
        tok = int(logits.argmax())
        got.append(tok)
        if i == N_DECODE - 1:
            break
        logits = K.decode(st, tok)
        assert np.abs(logits - oracle.ref_logits[PROMPT_LEN + i]).max() <= TOL, f"decode step {i}"
    np.testing.assert_array_equal(np.array(got, dtype=np.int32), oracle.greedy)
    assert st.n_tokens == PROMPT_LEN + N_DECODE - 1


def test_batched_indexer_on_off_identical(oracle):
    results = []
    for batched in (True, False):
        m = oracle.model(batched_indexer=batched)
        assert m.batched_indexer is batched
        st = K.State(m)
        results.append(K.prefill(st, oracle.tokens, chunk=37, all_logits=True)[1])
    np.testing.assert_array_equal(results[0], results[1])


def test_results_do_not_depend_on_chunking_or_call_splits(oracle):
    """Every step computes a token's numbers from its own inputs in a fixed order, so any chunk
    size, any split into calls (as after a restore or a capture) and token-by-token decode give
    bit-identical logits -- what lets the daemon start a kernel call anywhere."""
    m = oracle.model()
    toks = oracle.tokens
    ref = K.prefill(K.State(m), toks, chunk=512, all_logits=True)[1]
    for chunk in (1, 7, 37, 128):
        np.testing.assert_array_equal(K.prefill(K.State(m), toks, chunk=chunk, all_logits=True)[1], ref)
    st, rows = K.State(m), []
    for a, b in [(0, 37), (37, 38), (38, 131), (131, 300)]:
        rows.append(K.prefill(st, toks[a:b], chunk=64, all_logits=True)[1])
    rows += [K.decode(st, int(t))[None] for t in toks[300:]]
    np.testing.assert_array_equal(np.concatenate(rows), ref)


def test_decode_equals_prefill_chunk_1(small_oracle):
    m = small_oracle.model()
    a, b = K.State(m), K.State(m)
    K.prefill(a, small_oracle.tokens[:50], chunk=1)
    for t in small_oracle.tokens[:50]:
        last = K.decode(b, int(t))
    np.testing.assert_array_equal(a.last_logits, last)


def test_thread_counts_agree(small_oracle):
    """Bit-identical, as docs/validation.md claims: threads split the work, never a reduction."""
    out = []
    for threads in (1, 2):
        st = K.State(small_oracle.model(threads=threads))
        out.append(K.prefill(st, small_oracle.tokens, chunk=128, all_logits=True)[1])
    np.testing.assert_array_equal(out[0], out[1])


def test_long_context_last_64_positions_match_hf(long_oracle):
    """4160 tokens with CSA rate 4 and HCA rate 128: the indexer picks 16 of over 1000 entries and
    32 HCA rows are attended; every logit of the last 64 positions within 1e-4 of HF's."""
    st = K.State(long_oracle.model())
    head = LONG_LEN - LONG_TAIL
    assert K.prefill(st, long_oracle.tokens[:head], chunk=128)[0] == head
    n, logits = K.prefill(st, long_oracle.tokens[head:], chunk=128, all_logits=True)
    assert n == LONG_TAIL and logits.shape == long_oracle.tail_logits.shape
    diff = np.abs(logits - long_oracle.tail_logits).max(axis=1)
    assert diff.max() <= TOL, f"max |dlogit| {diff.max():.3g} at position {head + int(diff.argmax())}"
    assert (logits.argmax(1) == long_oracle.tail_logits.argmax(1)).all()
