"""verify and rewind: the kernel calls under exact speculative decoding.

verify feeds a decoded token and a draft in one call and gives every row's logits; rewind takes
back the rejected tail. After any mix of them the state must be the one plain decoding of the kept
tokens gives: the same snapshot bytes, the same last logits, and the same logits from then on.
"""

import numpy as np
import pytest

import cairn._kernel as K


def _state(model, tokens):
    st = K.State(model)
    if len(tokens):
        K.prefill(st, np.asarray(tokens, dtype=np.int32), chunk=5)
    return st


def _i32(x):
    return np.asarray(x, dtype=np.int32)


def _same_state(a, b, msg=""):
    assert a.n_tokens == b.n_tokens, msg
    assert a.snapshot().to_bytes() == b.snapshot().to_bytes(), msg
    np.testing.assert_array_equal(a.last_logits, b.last_logits, err_msg=msg)


def test_verify_rows_are_the_logits_of_decoding_one_by_one(oracle):
    """Every row of one verify call equals the decode of that token alone, at positions that cross
    window, compressor and page boundaries."""
    model = oracle.model()
    V = oracle.config["vocab_size"]
    rng = np.random.default_rng(11)
    for start, S in [(0, 1), (0, 9), (3, 6), (13, 17), (29, 8), (40, 33)]:
        prompt = rng.integers(0, V, start)
        toks = rng.integers(0, V, S)
        plain = _state(model, prompt)
        want = np.stack([K.decode(plain, int(t)) for t in toks])
        spec = _state(model, prompt)
        got = K.verify(spec, _i32(toks))
        np.testing.assert_array_equal(got, want, err_msg=f"start {start}, S {S}")
        _same_state(spec, plain, f"start {start}, S {S}")
        assert spec.rewindable == S


def test_rewind_leaves_the_state_of_plain_decoding(oracle):
    """Rewinding k of S tokens gives, byte for byte, the state of decoding the S - k kept ones,
    for every k, and the next decode agrees."""
    model = oracle.model()
    V = oracle.config["vocab_size"]
    rng = np.random.default_rng(5)
    for start, S in [(0, 6), (2, 5), (14, 19), (31, 12)]:
        prompt = rng.integers(0, V, start)
        toks = rng.integers(0, V, S)
        nxt = int(rng.integers(0, V))
        for k in range(S + 1):
            spec = _state(model, prompt)
            K.verify(spec, _i32(toks))
            K.rewind(spec, k)
            plain = _state(model, np.concatenate([prompt, toks[: S - k]]))
            _same_state(spec, plain, f"start {start}, S {S}, k {k}")
            assert spec.rewindable == S - k
            np.testing.assert_array_equal(K.decode(spec, nxt), K.decode(plain, nxt))
            assert spec.rewindable == 0


def test_a_mix_of_accepted_and_rejected_drafts_equals_plain_decoding(small_oracle):
    """Speculative steps with random acceptance, across many boundaries: the state after each
    step is that of plain decoding of the accepted tokens."""
    model = small_oracle.model(page_tokens=16)
    V = small_oracle.config["vocab_size"]
    rng = np.random.default_rng(2)
    spec = _state(model, rng.integers(0, V, 7))
    accepted = list(np.asarray(spec.tokens))
    for step in range(30):
        S = int(rng.integers(1, 12))
        toks = rng.integers(0, V, S)
        K.verify(spec, _i32(toks))
        k = int(rng.integers(0, S + 1))
        K.rewind(spec, k)
        if k and rng.random() < 0.3:         # a second rewind into the same call
            more = int(rng.integers(0, spec.rewindable + 1))
            K.rewind(spec, more)
            k += more
        accepted += list(toks[: S - k])
        if step % 6 == 5:
            _same_state(spec, _state(model, accepted), f"step {step}")
    _same_state(spec, _state(model, accepted))


def test_a_snapshot_taken_before_rewind_is_not_changed_by_it(small_oracle):
    """rewind drops compressed rows from a page group a snapshot shares: the snapshot keeps its
    own rows (the group is copied, as on write)."""
    model = small_oracle.model(page_tokens=16)
    rng = np.random.default_rng(9)
    spec = _state(model, rng.integers(0, 512, 10))
    K.verify(spec, _i32(rng.integers(0, 512, 12)))   # crosses a page boundary and several windows
    snap = spec.snapshot()
    before = snap.to_bytes()
    K.rewind(spec, 11)
    assert snap.to_bytes() == before
    restored = K.State.restore(model, snap)
    assert restored.n_tokens == 22
    _same_state(restored, _state(model, np.asarray(snap.tokens)))


def test_verify_batch_equals_verify_of_each_alone(small_oracle):
    """Several states, drafts of different lengths, in one call: the same rows and states as
    verify of each alone, and each rewinds on its own."""
    model = small_oracle.model()
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, 512, n) for n in (0, 9, 17, 30)]
    drafts = [rng.integers(0, 512, n) for n in (3, 1, 8, 5)]
    alone = [_state(model, p) for p in prompts]
    batched = [_state(model, p) for p in prompts]
    want = [K.verify(st, _i32(d)) for st, d in zip(alone, drafts)]
    got = K.verify_batch(batched, [_i32(d) for d in drafts])
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)
    for i, (a, b) in enumerate(zip(alone, batched)):
        k = i % (len(drafts[i]) + 1)
        K.rewind(a, k)
        K.rewind(b, k)
        _same_state(a, b, f"state {i}")


def test_rewind_refuses_what_it_cannot_take_back(small_oracle):
    model = small_oracle.model()
    st = _state(model, [1, 2, 3])
    with pytest.raises(K.KernelError, match="last call was not a speculative one"):
        K.rewind(st, 1)
    K.verify(st, _i32([4, 5, 6]))
    with pytest.raises(K.KernelError, match=r"k must be in 0..3.*got 4"):
        K.rewind(st, 4)
    with pytest.raises(K.KernelError, match=r"k must be in 0..3.*got -1"):
        K.rewind(st, -1)
    K.rewind(st, 2)
    assert st.rewindable == 1
    K.decode(st, 7)                                  # a plain call ends what can be rewound
    assert st.rewindable == 0
    with pytest.raises(K.KernelError, match="last call was not a speculative one"):
        K.rewind(st, 1)
    assert list(np.asarray(st.tokens)) == [1, 2, 3, 4, 7]


@pytest.mark.parametrize("draft, match", [
    ([], "tokens: tokens is empty"),
    ([1, 512], r"tokens: token id 512 at index 1 is out of range"),
    ([0] * 513, r"tokens has 513 tokens; one verify takes 1..512"),
])
def test_verify_rejects_bad_drafts(small_oracle, draft, match):
    st = K.State(small_oracle.model())
    with pytest.raises(K.KernelError, match=match):
        K.verify(st, _i32(draft))
    assert st.n_tokens == 0


def test_verify_batch_rejects_bad_input(small_oracle):
    model = small_oracle.model()
    a, b = K.State(model), K.State(model)
    with pytest.raises(K.KernelError, match="states is empty"):
        K.verify_batch([], [])
    with pytest.raises(K.KernelError, match="must match"):
        K.verify_batch([a, b], [_i32([1])])
    with pytest.raises(K.KernelError, match=r"states\[1\] appears twice"):
        K.verify_batch([a, a], [_i32([1]), _i32([2])])
    with pytest.raises(K.KernelError, match=r"tokens\[1\]: token id 600"):
        K.verify_batch([a, b], [_i32([1]), _i32([600])])
    with pytest.raises(K.KernelError, match="512 tokens in all|feeds 600 tokens"):
        K.verify_batch([a, b], [_i32([1] * 300), _i32([1] * 300)])
    assert a.n_tokens == b.n_tokens == 0
