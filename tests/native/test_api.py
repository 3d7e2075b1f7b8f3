"""Kernel API contract: argument validation, abort between chunks, model validation."""

import threading

import numpy as np
import pytest

import cairn._kernel as K


@pytest.fixture(scope="module")
def model(small_oracle):
    return small_oracle.model()


def test_module_constants():
    assert K.MAX_CHUNK >= 128 and K.SNAPSHOT_VERSION >= 1
    assert issubclass(K.KernelError, ValueError)


@pytest.mark.parametrize(
    "tokens, match",
    [
        (np.array([], dtype=np.int32), "empty"),
        (np.array([1, 2, 512], dtype=np.int32), "out of range"),
        (np.array([1, -1], dtype=np.int32), "out of range"),
        (np.arange(10, dtype=np.int64), "int32"),
        (np.arange(20, dtype=np.int32)[::2], "contiguous"),
        (np.zeros((2, 3), dtype=np.int32), "1-D"),
        ([1, 2, 3], "numpy"),
    ],
)
def test_prefill_rejects_bad_tokens(model, tokens, match):
    st = K.State(model)
    with pytest.raises(ValueError, match=match):
        K.prefill(st, tokens)
    assert st.n_tokens == 0


@pytest.mark.parametrize("chunk", [0, -1, K.MAX_CHUNK + 1])
def test_prefill_rejects_bad_chunk(model, chunk):
    with pytest.raises(ValueError, match="chunk"):
        K.prefill(K.State(model), np.arange(5, dtype=np.int32), chunk=chunk)


@pytest.mark.parametrize("token", [-1, 512, 10**12])
def test_decode_rejects_bad_token(model, token):
    with pytest.raises(ValueError, match="out of range"):
        K.decode(K.State(model), token)


def test_preset_abort_does_nothing(model):
    flag = K.AbortFlag()
    flag.set()
    assert flag.is_set()
    st = K.State(model)
    n, logits = K.prefill(st, np.arange(10, dtype=np.int32), abort=flag)
    assert n == 0 and logits.size == 0 and st.n_tokens == 0 and st.last_logits is None
    flag.clear()
    assert not flag.is_set()


def _wait_until_busy(st, th) -> None:
    """Return once a kernel call holds st (its getters raise), or fail if the thread ended first.
    n_tokens is polled: it claims the state for a plain load and allocates nothing while it does, so
    the poll can never make the call's own claim fail."""
    while True:
        try:
            st.n_tokens
        except K.StateBusyError:
            return
        assert th.is_alive(), "the kernel call ended before it was seen holding the state"


def _prefill_in_thread(st, tokens, chunk, flag):
    result = {}
    th = threading.Thread(target=lambda: result.setdefault("r", K.prefill(st, tokens, chunk=chunk, abort=flag)))
    th.start()
    return th, result


def test_abort_from_other_thread_stops_after_current_chunk(model, small_oracle):
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, model.vocab_size, 6000, dtype=np.int32)
    chunk = 7
    flag = K.AbortFlag()
    st = K.State(model)
    start = 3 * chunk
    K.prefill(st, tokens[:start], chunk=chunk)   # so the aborted call leaves logits, however early it stops
    th, result = _prefill_in_thread(st, tokens[start:], chunk, flag)
    _wait_until_busy(st, th)
    flag.set()
    th.join()
    done, logits = result["r"]
    # it stopped between chunks, long before the end of the prompt
    assert done % chunk == 0 and done < len(tokens) - start
    n = start + done
    assert st.n_tokens == n
    np.testing.assert_array_equal(st.tokens, tokens[:n])
    if done:
        np.testing.assert_array_equal(logits, st.last_logits)
    # continuing gives the same logits as never having stopped
    more = tokens[n : n + 3 * chunk]
    _, cont = K.prefill(st, more, chunk=chunk, all_logits=True)
    ref = K.State(model)
    _, all_ref = K.prefill(ref, tokens[: n + len(more)], chunk=chunk, all_logits=True)
    np.testing.assert_array_equal(cont, all_ref[n:])


# Every State getter that reads the state's mutable data (page_nbytes is the model's figure).
STATE_GETTERS = ["n_tokens", "rewindable", "journal_nbytes", "tokens", "nbytes", "page_ids", "tail_nbytes",
                 "last_logits"]


def test_a_busy_states_getters_raise_until_the_call_ends(model):
    """While a prefill runs with the GIL released (appending tokens and page groups), every getter
    raises StateBusyError, a RuntimeError, instead of reading vectors the call is growing; once it
    ends they work. The prefill is long and only stops when the flag is set, after the checks."""
    rng = np.random.default_rng(11)
    tokens = rng.integers(0, model.vocab_size, 6000, dtype=np.int32)
    st = K.State(model)
    K.prefill(st, tokens[:40], chunk=8)
    assert K.StateBusyError.__mro__[1] is RuntimeError
    flag = K.AbortFlag()
    th, result = _prefill_in_thread(st, tokens[40:], 7, flag)
    try:
        _wait_until_busy(st, th)
        for name in STATE_GETTERS:
            with pytest.raises(K.StateBusyError, match=r"in use by a kernel call .*published when the call ends"):
                getattr(st, name)
        assert st.page_nbytes == model.page_nbytes   # the model's, not the state's
        # a second kernel call on the busy state is refused the same way, not raced
        with pytest.raises(K.StateBusyError, match="already in use"):
            K.decode(st, 1)
        with pytest.raises(K.StateBusyError, match="already in use"):
            st.snapshot()
    finally:
        flag.set()
        th.join()
    done, _ = result["r"]
    assert done < len(tokens) - 40   # the checks ran while the call held the state
    assert st.n_tokens == 40 + done and len(st.tokens) == 40 + done and st.last_logits is not None
    assert st.nbytes > 0 and st.tail_nbytes > 0 and st.rewindable == 0 and st.journal_nbytes == 0
    full = st.n_tokens // model.page_tokens
    assert full <= len(st.page_ids) <= full + 1


def test_model_rejects_missing_and_misshapen_weights(small_oracle):
    cfg, w = small_oracle.config, dict(small_oracle.weights)
    del w["layers.1.attn.wkv.weight"]
    with pytest.raises(ValueError, match="layers.1.attn.wkv.weight"):
        K.Model(cfg, w, "x")
    w = dict(small_oracle.weights)
    w["layers.2.attn.compressor.ape"] = (np.zeros((3, 5), np.float32), "F32")
    with pytest.raises(ValueError, match=r"layers.2.attn.compressor.ape.*\[3, 5\].*expected \[4, 128\]"):
        K.Model(cfg, w, "x")
    bad = dict(cfg, layer_types=cfg["layer_types"][:-1])
    with pytest.raises(ValueError, match="layer_types"):
        K.Model(bad, small_oracle.weights, "x")


def test_bf16_and_f16_weights_load(small_oracle):
    """BF16 (uint16 view) and F16 arrays are widened at load; results stay close to fp32."""
    w = {}
    for i, (k, (a, tag)) in enumerate(small_oracle.weights.items()):
        if tag == "F32" and a.ndim == 2 and i % 2:
            bf = (a.view(np.uint32) + 0x8000 >> 16).astype(np.uint16)  # round to bf16
            w[k] = (bf, "BF16")
        elif tag == "F32" and a.ndim == 2:
            w[k] = (a.astype(np.float16), "F16")
        else:
            w[k] = (a, tag)
    m = K.Model(small_oracle.config, w, "lowp", 1)
    _, lg = K.prefill(K.State(m), small_oracle.tokens[:64], chunk=64)
    ref = small_oracle.ref_logits[63]
    assert np.isfinite(lg).all() and np.corrcoef(lg, ref)[0, 1] > 0.9


def test_bf16_panels_give_the_bits_of_widened_fp32(small_oracle):
    """BF16 matrices stay BF16 panels, widened inside the product (exact): the same logits as
    widening at load (widen_bf16=True) and as handing the kernel the widened values as F32.
    Expert 0's w3 stays F32, so its fused gate/up pair takes the fp32-panel path beside BF16 ones."""
    bf, widened = {}, {}
    for k, (a, tag) in small_oracle.weights.items():
        if tag == "F32" and a.ndim == 2 and "experts.0.w3" not in k:
            b = ((a.view(np.uint32) + 0x8000) >> 16).astype(np.uint16)  # round to bf16
            bf[k] = (b, "BF16")
            widened[k] = ((b.astype(np.uint32) << 16).view(np.float32), "F32")
        else:
            bf[k] = widened[k] = (a, tag)
    runs = []
    for weights, kw in ((bf, {}), (bf, {"widen_bf16": True}), (widened, {})):
        m = K.Model(small_oracle.config, weights, "bf16", 2, **kw)
        assert m.widen_bf16 is bool(kw)
        st = K.State(m)
        _, lg = K.prefill(st, small_oracle.tokens[:200], chunk=64, all_logits=True)
        runs.append(np.concatenate([lg, K.decode(st, int(small_oracle.tokens[200]))[None]]))
    assert np.isfinite(runs[0]).all()
    np.testing.assert_array_equal(runs[0], runs[1])
    np.testing.assert_array_equal(runs[0], runs[2])


def test_model_properties(model, small_oracle):
    assert model.fingerprint == small_oracle.fingerprint
    assert model.vocab_size == small_oracle.config["vocab_size"]
    assert model.n_layers == small_oracle.config["num_hidden_layers"]
    assert model.threads == 2
    assert K.Model(small_oracle.config, small_oracle.weights, "x", 0).threads >= 1


def test_profile_has_no_shared_bucket_that_always_reads_zero(tiny_model_dir):
    """The shared expert runs inside the routed experts' parallel phases; its time is in `experts`.
    A separate `shared` section could only ever read ~0 (it did, in docs/benchmarks.md's tables)."""
    from cairn.daemon.weights.model_dir import load_model

    m = load_model(tiny_model_dir, 1)
    K._profile(True)
    K.prefill(K.State(m), np.arange(5, 69, dtype=np.int32))
    prof = K._profile(True)
    assert list(prof) == ["hc", "qkv", "compress", "indexer", "attn", "out", "router", "experts", "head"]
    assert prof["experts"] > 0 and prof["hc"] > 0
