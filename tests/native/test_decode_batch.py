"""decode_batch: one decode step for several states, bit-identical to decoding each alone."""

import threading

import numpy as np
import pytest

import cairn._kernel as K


def _prefilled(model, tokens):
    st = K.State(model)
    if len(tokens):
        K.prefill(st, np.asarray(tokens, dtype=np.int32), chunk=7)
    return st


def test_batched_decode_is_bit_identical_to_single_decode(oracle):
    """Sequences at different positions (one empty, others crossing window and compressor
    boundaries while decoding) give the same logits and the same state bytes batched or alone."""
    model = oracle.model()
    V = oracle.config["vocab_size"]
    rng = np.random.default_rng(7)
    lengths = [0, 3, 15, 17, 31, 40]
    prompts = [rng.integers(0, V, n) for n in lengths]
    alone = [_prefilled(model, p) for p in prompts]
    batched = [_prefilled(model, p) for p in prompts]
    steps = rng.integers(0, V, (20, len(lengths)))
    for step in steps:
        want = np.stack([K.decode(st, int(t)) for st, t in zip(alone, step)])
        got = K.decode_batch(batched, [int(t) for t in step])
        np.testing.assert_array_equal(got, want)
    for a, b in zip(alone, batched):
        assert a.snapshot().to_bytes() == b.snapshot().to_bytes()
        np.testing.assert_array_equal(a.last_logits, b.last_logits)


def test_batched_decode_of_a_subset_and_in_another_order(small_oracle):
    """Which states share a step, and their order, does not change any one of them."""
    model = small_oracle.model()
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 512, n) for n in (5, 21, 34)]
    alone = [_prefilled(model, p) for p in prompts]
    batched = [_prefilled(model, p) for p in prompts]
    for step, order in enumerate([[0, 1, 2], [2, 0], [1], [2, 1, 0], [0, 2]]):
        toks = [int(rng.integers(0, 512)) for _ in order]
        want = np.stack([K.decode(alone[i], t) for i, t in zip(order, toks)])
        got = K.decode_batch([batched[i] for i in order], np.array(toks, dtype=np.int32))
        np.testing.assert_array_equal(got, want, err_msg=f"step {step}")
    for a, b in zip(alone, batched):
        assert a.snapshot().to_bytes() == b.snapshot().to_bytes()


def test_batched_decode_with_more_threads_matches(small_oracle):
    """The threaded projections over B rows split work differently; the bits stay the same."""
    m1, m2 = small_oracle.model(threads=1), small_oracle.model(threads=2)
    prompts = [small_oracle.tokens[:n] for n in (9, 26)]
    s1 = [_prefilled(m1, p) for p in prompts]
    s2 = [_prefilled(m2, p) for p in prompts]
    for t in (1, 2, 3):
        np.testing.assert_array_equal(K.decode_batch(s1, [t, t + 1]), K.decode_batch(s2, [t, t + 1]))


@pytest.fixture(scope="module")
def model(small_oracle):
    return small_oracle.model()


@pytest.mark.parametrize(
    "states_n, tokens, match",
    [
        (0, [], "states is empty"),
        (2, [1], "must match"),
        (2, [1, 512], r"tokens\[1\].*out of range"),
        (2, [-1, 1], r"tokens\[0\].*out of range"),
        (2, [1, 2.5], r"tokens\[1\] must be an integer"),
        (1, [10**30], r"tokens\[0\] is not a 64-bit integer"),
    ],
)
def test_decode_batch_rejects_bad_tokens(model, states_n, tokens, match):
    states = [K.State(model) for _ in range(states_n)]
    with pytest.raises(ValueError, match=match):
        K.decode_batch(states, tokens)
    assert all(st.n_tokens == 0 for st in states)


def test_decode_batch_rejects_repeated_state_and_non_states(model):
    st = K.State(model)
    with pytest.raises(ValueError, match=r"states\[1\] appears twice"):
        K.decode_batch([st, st], [1, 2])
    with pytest.raises(ValueError, match=r"states\[1\] is not a State"):
        K.decode_batch([st, "x"], [1, 2])
    assert st.n_tokens == 0


def test_decode_batch_rejects_a_state_of_another_model(small_oracle, model):
    other = small_oracle.model()
    a, b = K.State(model), K.State(other)
    with pytest.raises(ValueError, match=r"states\[1\] belongs to another model"):
        K.decode_batch([a, b], [1, 2])
    assert a.n_tokens == 0 and b.n_tokens == 0


def test_decode_batch_preset_abort_does_nothing(model):
    flag = K.AbortFlag()
    flag.set()
    states = [K.State(model), K.State(model)]
    out = K.decode_batch(states, [1, 2], abort=flag)
    assert out.shape == (0, 512)
    assert all(st.n_tokens == 0 and st.last_logits is None for st in states)
    flag.clear()
    assert K.decode_batch(states, [1, 2], abort=flag).shape == (2, 512)
    assert [st.n_tokens for st in states] == [1, 1]


def test_decode_batch_state_in_use_is_refused_and_others_released(small_oracle, model):
    """A state busy in another call (a long prefill on another thread) makes the batch fail
    without advancing or locking the free states."""
    free, busy = K.State(model), K.State(model)
    flag = K.AbortFlag()
    long = np.resize(small_oracle.tokens, 4096).astype(np.int32)
    started = threading.Event()
    result = {}

    def run():
        started.set()
        result["n"] = K.prefill(busy, long, chunk=1, abort=flag)[0]

    th = threading.Thread(target=run)
    th.start()
    started.wait()
    # the prefill thread holds `busy` from before it releases the GIL until it returns
    try:
        while True:  # until the other call owns the state: its getters refuse while it does
            try:
                busy.n_tokens
            except K.StateBusyError:
                break
            assert th.is_alive()
        with pytest.raises(RuntimeError, match=r"states\[1\] is already in use"):
            K.decode_batch([free, busy], [1, 2])
    finally:
        flag.set()
        th.join()
    assert free.n_tokens == 0
    K.decode_batch([free], [1])  # not left claimed
    assert free.n_tokens == 1
