"""Qwen3.5 on the shared state machinery (issue 43 step 5): a `_kernel.Model` of family qwen3_5 is what
State, prefill, decode, decode_batch, the StepWorker and snapshots take. Its tail (per GDN layer the
conv rows and the recurrent state) and its pages (per full-attention layer K and V rows) give the
same bits under any chunking, decode vs prefill, batched decode and restore at any position; blobs
of another family, truncated or corrupt ones are refused by name; sizes are the plan's formula; and
speculation is off with a clear error."""

from __future__ import annotations

import json
import select

import numpy as np
import pytest

import cairn._kernel as K
from cairn.daemon.modelgen.make_model import make_model
from cairn.daemon.weights.model_dir import load_model, open_model_dir

from hf_oracle_qwen35 import hf_logits
from test_qwen35_parity import TOL, _kernel_weights

SEED = 7
PAGE = 16
N = 140
TOKENS = (np.arange(N, dtype=np.int64) * 131 % 509 + 3).astype(np.int32)   # [140] ids < vocab 512


@pytest.fixture(scope="module", params=["qwen35-tiny", "qwen35moe-tiny"])
def qwen(request, tmp_path_factory):
    d = make_model(request.param, SEED, tmp_path_factory.mktemp(request.param))
    config = json.loads((d / "config.json").read_text())
    weights = _kernel_weights(d)
    m = K.Model(config, weights, "qwen-" + request.param, 1, page_tokens=PAGE)
    return d, config, weights, m


def _prefill(m, ids, chunk):
    st = K.State(m)
    n, logits = K.prefill(st, ids, chunk=chunk, all_logits=True)
    assert n == len(ids)
    return st, logits


def _blob(st):
    return st.snapshot().to_bytes()


def test_model_is_the_qwen_family_and_takes_every_shared_call(qwen):
    _, config, weights, m = qwen
    assert m.family == "qwen3_5" and m.supports_verify is False and m.page_tokens == PAGE
    assert m.vocab_size == config["vocab_size"]
    # the default page size of the family
    assert K.Model(config, weights, "x", 1).page_tokens == 64
    # Qwen35Model is a thin wrapper: its forward is the shared State's prefill
    q = K.Qwen35Model(config, weights, threads=1)
    assert q.model.family == "qwen3_5"
    _, logits = _prefill(q.model, TOKENS[:40], 40)
    assert q.forward(TOKENS[:40]).tobytes() == logits.tobytes()


@pytest.mark.parametrize("chunk", [1, 7, 37, 128])
def test_chunking_gives_the_bits_of_one_call(qwen, chunk):
    m = qwen[3]
    ref_st, ref = _prefill(m, TOKENS, len(TOKENS))
    st, logits = _prefill(m, TOKENS, chunk)
    assert logits.tobytes() == ref.tobytes()
    assert _blob(st) == _blob(ref_st)


def test_decode_after_prefill_equals_prefill(qwen):
    m = qwen[3]
    ref_st, ref = _prefill(m, TOKENS[:60], 60)
    st, _ = _prefill(m, TOKENS[:50], 50)
    for i in range(50, 60):
        out = K.decode(st, int(TOKENS[i]))
        assert out.tobytes() == ref[i].tobytes()
    assert _blob(st) == _blob(ref_st)
    # the StepWorker (the engine's decode path) runs the same step
    st2, _ = _prefill(m, TOKENS[:59], 59)
    w = K.StepWorker()
    import threading
    t = threading.Thread(target=w.serve, args=(5.0,))
    t.start()
    w.decode(st2, int(TOKENS[59]))
    select.select([w.fileno()], [], [], 10)
    out, *_ = w.collect()
    w.post_python()
    t.join()
    assert out.tobytes() == ref[59].tobytes()


def test_decode_batch_equals_each_alone(qwen):
    m = qwen[3]
    lens = (3, 20, 33)   # below K-1, inside the first page, across pages
    states = [_prefill(m, TOKENS[:n], 16)[0] for n in lens]
    alone = [_prefill(m, TOKENS[:n], 16)[0] for n in lens]
    for step in range(4):
        toks = [int(TOKENS[n + step]) for n in lens]
        batch = K.decode_batch(states, toks)
        for b, st in enumerate(alone):
            assert batch[b].tobytes() == K.decode(st, toks[b]).tobytes()
    assert [_blob(s) for s in states] == [_blob(s) for s in alone]


def test_snapshot_restore_at_every_position_continues_with_the_same_bits(qwen):
    m = qwen[3]
    ref_st, ref = _prefill(m, TOKENS, 1)
    st = K.State(m)
    for n in range(0, N):
        if n:
            K.decode(st, int(TOKENS[n - 1]))
        snap = st.snapshot()
        assert snap.n_tokens == n and snap.n_full_pages == n // PAGE
        # three ways back: in memory, the self-contained blob, the tail and the pages
        back = [K.State.restore(m, snap), K.State.restore(m, K.Snapshot.from_bytes(m, snap.to_bytes())),
                K.State.restore(m, K.Snapshot.from_parts(m, snap.tail(),
                                                         [snap.page(k) for k in range(snap.n_full_pages)]))]
        for r in back:
            assert r.n_tokens == n
            # continue for a few tokens: the bits of never stopping
            for i in range(n, min(n + 3, N)):
                assert K.decode(r, int(TOKENS[i])).tobytes() == ref[i].tobytes()
        if n in (0, 2, 3, 17, 64, 139):   # the blob round trip is byte for byte
            assert K.Snapshot.from_bytes(m, snap.to_bytes()).to_bytes() == snap.to_bytes()
    assert K.decode(st, int(TOKENS[N - 1])).tobytes() == ref[N - 1].tobytes()


def test_sizes_are_the_plans_formula(qwen):
    _, config, _, m = qwen
    c = config.get("text_config", config)
    kinds = c["layer_types"]
    n_gdn, n_full = kinds.count("linear_attention"), kinds.count("full_attention")
    k1 = c["linear_conv_kernel_dim"] - 1
    conv_dim = 2 * c["linear_num_key_heads"] * c["linear_key_head_dim"] + \
        c["linear_num_value_heads"] * c["linear_value_head_dim"]
    rec = c["linear_num_value_heads"] * c["linear_key_head_dim"] * c["linear_value_head_dim"]
    kv_row = c["num_key_value_heads"] * c["head_dim"]
    V = c["vocab_size"]
    assert m.page_nbytes == 4 * PAGE * n_full * 2 * kv_row
    for n in (0, 1, 2, 3, 5, 16, 40):
        st = K.State(m)
        if n:
            K.prefill(st, TOKENS[:n], chunk=64)
        tail_floats = n_gdn * (min(n, k1) * conv_dim + (rec if n else 0))
        assert st.nbytes == 4 * (tail_floats + n * n_full * 2 * kv_row)
        groups = len(st.page_ids)
        assert groups == -(-n // PAGE)
        assert st.tail_nbytes == 4 * (tail_floats + n + (V if n else 0)) + 8 * 2 * groups
        assert st.snapshot().own_nbytes == st.tail_nbytes


def test_truncated_corrupt_and_foreign_blobs_are_refused(qwen, tmp_path_factory):
    m = qwen[3]
    st, _ = _prefill(m, TOKENS[:40], 40)
    snap = st.snapshot()
    blob, tail = snap.to_bytes(), snap.tail()
    with pytest.raises(ValueError, match="truncated"):
        K.Snapshot.from_bytes(m, blob[:100])
    with pytest.raises(ValueError, match="checksum mismatch"):   # the groups' checksum sees a cut end
        K.Snapshot.from_bytes(m, blob[:-20])
    with pytest.raises(ValueError, match="truncated"):
        K.Snapshot.from_parts(m, tail[:-9], [snap.page(k) for k in range(snap.n_full_pages)])
    bad = bytearray(tail)
    bad[len(bad) // 2] ^= 0x40
    with pytest.raises(ValueError, match="checksum"):
        K.Snapshot.from_parts(m, bytes(bad), [snap.page(k) for k in range(snap.n_full_pages)])
    bad = bytearray(blob)
    bad[len(tail) + 5] ^= 0x40   # inside the first page group
    with pytest.raises(ValueError, match="checksum"):
        K.Snapshot.from_bytes(m, bytes(bad))
    with pytest.raises(ValueError, match="page groups"):
        K.Snapshot.from_parts(m, tail, [])
    # V4 <-> Qwen: each reader names the other family, whatever the fingerprints say
    v4 = load_model(open_model_dir(make_model("tiny", SEED, tmp_path_factory.mktemp("v4"))), page_tokens=PAGE)
    vs = K.State(v4)
    K.prefill(vs, TOKENS[:40] % v4.vocab_size, chunk=40)
    vsnap = vs.snapshot()
    with pytest.raises(ValueError, match="snapshot is of model family qwen3_5, this model is deepseek_v4"):
        K.Snapshot.from_bytes(v4, blob)
    with pytest.raises(ValueError, match="not a qwen3_5 snapshot"):
        K.Snapshot.from_bytes(m, vsnap.to_bytes())
    with pytest.raises(ValueError, match="not a qwen3_5 snapshot"):
        K.Snapshot.from_parts(m, vsnap.tail(), [vsnap.page(k) for k in range(vsnap.n_full_pages)])
    with pytest.raises(ValueError, match="model family deepseek_v4, this model is qwen3_5"):
        K.State.restore(m, vsnap)
    with pytest.raises(ValueError, match="model family qwen3_5, this model is deepseek_v4"):
        K.State.restore(v4, snap)
    assert v4.family == "deepseek_v4" and v4.supports_verify is True


def test_speculation_is_off_with_a_clear_error(qwen):
    m = qwen[3]
    st, _ = _prefill(m, TOKENS[:10], 10)
    before = _blob(st)
    with pytest.raises(ValueError, match="speculative decoding is off for qwen3_5: "):
        K.verify(st, TOKENS[10:13])
    with pytest.raises(ValueError, match="speculative decoding is off for qwen3_5: "):
        K.verify_batch([st], [TOKENS[10:13]])
    with pytest.raises(ValueError, match="speculative decoding is off for qwen3_5"):
        m.verify_journal_nbytes(3)
    assert _blob(st) == before and st.rewindable == 0


def test_logits_match_hf_after_a_restore(qwen):
    d, _, _, m = qwen
    ids = TOKENS[:96]
    ref = hf_logits(d, ids)
    st, _ = _prefill(m, ids[:41], 7)
    r = K.State.restore(m, K.Snapshot.from_bytes(m, st.snapshot().to_bytes()))
    _, rest = K.prefill(r, ids[41:], chunk=13, all_logits=True)
    assert np.abs(rest - ref[41:]).max() <= TOL
