"""The CSA indexer's keys kept as panels inside their page groups (native/include/cairn/pages.h).

Where a group holds a multiple of 16 indexer rows (the default 256-token pages at csa_rate 4: 64),
the keys are written in the packed micro-kernel's panel layout and scored in place: no key is
re-packed per token, and a decode's scoring splits over threads. Where it does not (small test
pages), the rows stay row-major and are packed per call. Both give the same bits, through prefill,
decode, snapshots, restore and rewind."""

import numpy as np
import pytest

import cairn._kernel as K

PANELS = 64   # 16 indexer rows a group: panel layout
ROWS = 16     # 4 indexer rows a group: row layout, packed per call
DEPTH = 1400  # 350 keys (> 5 groups of 64): past the parallel threshold (350 x 16 heads x 32)


def _tokens(oracle, n, seed=5):
    return np.random.default_rng(seed).integers(0, oracle.config["vocab_size"], n, dtype=np.int32)


def _decode(model, prompt, nxt, chunk=97):
    st = K.State(model)
    K.prefill(st, prompt, chunk=chunk)
    K._indexer_stats(True)
    out = [K.decode(st, int(t)) for t in nxt]
    return st, np.stack(out), K._indexer_stats(True)


def test_decode_at_depth_reads_the_panels_in_place_on_both_threads(small_oracle):
    toks = _tokens(small_oracle, DEPTH + 6)
    csa = small_oracle.config["layer_types"].count("compressed_sparse_attention")
    assert csa >= 1
    st, panels, stats = _decode(small_oracle.model(threads=2), toks[:DEPTH], toks[DEPTH:])
    assert st.n_tokens == DEPTH + 6
    assert stats["packed_floats"] == 0                     # nothing re-packed per token
    assert stats["parallel_decode"] == 6 * csa             # every S = 1 scoring split over 2 threads
    _, rows, stats = _decode(small_oracle.model(threads=2, page_tokens=ROWS), toks[:DEPTH], toks[DEPTH:])
    assert stats["packed_floats"] >= 6 * csa * (DEPTH // 4) * small_oracle.config["index_head_dim"]
    assert np.array_equal(panels, rows)                    # the same bits either layout
    _, one, stats = _decode(small_oracle.model(threads=1), toks[:DEPTH], toks[DEPTH:])
    assert stats["parallel_decode"] == 0
    assert np.array_equal(panels, one)                     # and on one thread


@pytest.mark.parametrize("page_tokens", [PANELS, 0])
def test_panel_layout_equals_row_layout_and_the_reference(small_oracle, page_tokens):
    toks = _tokens(small_oracle, 700, seed=6)
    ref_model = small_oracle.model(page_tokens=ROWS)
    _, ref = K.prefill(K.State(ref_model), toks, chunk=61, all_logits=True)
    m = small_oracle.model(page_tokens=page_tokens)
    _, got = K.prefill(K.State(m), toks, chunk=61, all_logits=True)
    assert np.array_equal(got, ref)
    m.batched_indexer = False                              # scalar loop reading the panels' lanes
    _, scalar = K.prefill(K.State(m), toks, chunk=61, all_logits=True)
    assert np.array_equal(scalar, ref)


def test_snapshot_restore_and_rewind_follow_the_panel_layout(small_oracle):
    """A partial group's rows travel in the tail as rows and come back as panels; a rewound row's
    lane is zero again, so the state's bytes are those of plain decoding."""
    m = small_oracle.model(page_tokens=PANELS)
    toks = _tokens(small_oracle, 400, seed=7)
    cut = 3 * PANELS + 37                                  # 3 full groups, a partial panel in the 4th
    st = K.State(m)
    K.prefill(st, toks[:cut], chunk=50)
    snap = st.snapshot()
    again = K.Snapshot.from_bytes(m, snap.to_bytes())
    assert again.to_bytes() == snap.to_bytes()
    a = K.State.restore(m, again)
    b = K.State(m)
    K.prefill(b, toks[:cut], chunk=50)
    _, la = K.prefill(a, toks[cut:], chunk=13, all_logits=True)
    _, lb = K.prefill(b, toks[cut:], chunk=13, all_logits=True)
    assert np.array_equal(la, lb)
    assert a.snapshot().to_bytes() == b.snapshot().to_bytes()
    spec = K.State(m)
    K.prefill(spec, toks[:cut], chunk=50)
    K.verify(spec, toks[cut:cut + 11])                     # closes windows: rows appended
    K.rewind(spec, 9)
    plain = K.State(m)
    K.prefill(plain, toks[:cut + 2], chunk=50)
    assert spec.snapshot().to_bytes() == plain.snapshot().to_bytes()


def test_a_version_3_snapshot_is_refused(small_oracle):
    m = small_oracle.model()
    st = K.State(m)
    K.prefill(st, _tokens(small_oracle, 300), chunk=64)
    blob = bytearray(st.snapshot().to_bytes())
    assert K.SNAPSHOT_VERSION == 4
    blob[8:12] = (3).to_bytes(4, "little")
    with pytest.raises(ValueError, match="version 3 .*indexer's keys"):
        K.Snapshot.from_bytes(m, bytes(blob))
