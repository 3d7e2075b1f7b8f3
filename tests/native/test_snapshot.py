"""Snapshot / restore: immutable snapshots and versioned blobs; restore == never stopping; bad blobs
rejected. The oracle's pages hold 256 tokens, so cuts past 256 restore a full page group as well."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import cairn._kernel as K

from hf_oracle import PROMPT_LEN

CHUNK = 37


def _continue(st, tokens):
    n, logits = K.prefill(st, tokens, chunk=CHUNK, all_logits=True)
    assert n == len(tokens)
    return logits


@pytest.fixture(scope="module")
def uninterrupted(small_oracle):
    """Never-stopped run per cut point: prefill [:cut] then [cut:] with the same chunking."""
    m = small_oracle.model()
    out = {}
    for cut in (37, 131, 256, 300):
        st = K.State(m)
        K.prefill(st, small_oracle.tokens[:cut], chunk=CHUNK)
        out[cut] = _continue(st, small_oracle.tokens[cut:])
    return out


@pytest.mark.parametrize("via", ["memory", "bytes"])
@pytest.mark.parametrize("cut", [37, 131, 256, 300])
def test_restore_continues_identically(small_oracle, uninterrupted, cut, via):
    m = small_oracle.model()
    st = K.State(m)
    K.prefill(st, small_oracle.tokens[:cut], chunk=CHUNK)
    snap = st.snapshot()
    assert isinstance(snap, K.Snapshot) and snap.n_tokens == cut
    assert snap.n_full_pages == cut // m.page_tokens
    blob = snap.to_bytes()
    fresh = K.State.restore(m, snap if via == "memory" else K.Snapshot.from_bytes(m, blob))
    assert fresh.n_tokens == cut
    np.testing.assert_array_equal(fresh.tokens, small_oracle.tokens[:cut])
    np.testing.assert_array_equal(fresh.last_logits, st.last_logits)
    assert fresh.nbytes == st.nbytes
    assert fresh.snapshot().to_bytes() == blob
    logits = _continue(fresh, small_oracle.tokens[cut:])
    assert np.array_equal(logits, uninterrupted[cut])
    assert np.abs(logits - small_oracle.ref_logits[cut:]).max() <= 1e-4
    # the original state is unaffected by the restore and can continue as well
    assert np.array_equal(_continue(st, small_oracle.tokens[cut:]), uninterrupted[cut])
    # and so is the snapshot: a second restore continues the same way
    assert np.array_equal(_continue(K.State.restore(m, snap), small_oracle.tokens[cut:]), uninterrupted[cut])


def test_restore_in_fresh_process(small_oracle, uninterrupted, tmp_path):
    cut = 300
    st = K.State(small_oracle.model())
    K.prefill(st, small_oracle.tokens[:cut], chunk=CHUNK)
    (tmp_path / "state.bin").write_bytes(st.snapshot().to_bytes())
    np.save(tmp_path / "rest.npy", small_oracle.tokens[cut:])
    script = textwrap.dedent(f"""
        import sys, numpy as np
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import hf_oracle, cairn._kernel as K
        _, cfg, w, fp, _ = hf_oracle.model_inputs({small_oracle.name!r})
        m = K.Model(cfg, w, fp, 2)  # same threads as the in-process run
        st = K.State.restore(m, K.Snapshot.from_bytes(m, open({str(tmp_path / "state.bin")!r}, "rb").read()))
        n, lg = K.prefill(st, np.load({str(tmp_path / "rest.npy")!r}), chunk={CHUNK}, all_logits=True)
        np.save({str(tmp_path / "out.npy")!r}, lg)
    """)
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path, timeout=300)
    logits = np.load(tmp_path / "out.npy")
    assert np.array_equal(logits, uninterrupted[cut])


def test_empty_state_roundtrip(small_oracle):
    m = small_oracle.model()
    st = K.State(m)
    assert st.n_tokens == 0 and st.last_logits is None and st.nbytes == 0
    assert st.tokens.dtype == np.int32 and st.tokens.shape == (0,)
    r = K.State.restore(m, K.Snapshot.from_bytes(m, st.snapshot().to_bytes()))
    assert r.n_tokens == 0 and r.last_logits is None


def test_nbytes_matches_digest_formula(small_oracle):
    c = small_oracle.config
    st = K.State(small_oracle.model())
    K.prefill(st, small_oracle.tokens[:PROMPT_LEN], chunk=128)
    n, W, Dh, Di = PROMPT_LEN, c["sliding_window"], c["head_dim"], c["index_head_dim"]
    m, mh = c["csa_rate"], c["hca_rate"]
    floats = 0
    for t in c["layer_types"]:
        floats += min(n, W - 1) * Dh
        if t == "compressed_sparse_attention":
            for d in (Dh, Di):
                floats += (n // m) * d + 2 * (n % m) * 2 * d + (2 * m * d if n >= m else 0)
        elif t == "heavily_compressed_attention":
            floats += (n // mh) * Dh + 2 * (n % mh) * Dh
    assert st.nbytes == 4 * floats
    assert st.snapshot().nbytes >= st.nbytes


CUT = 300  # one full page group and a partial one


@pytest.fixture(scope="module")
def blob(small_oracle):
    st = K.State(small_oracle.model())
    K.prefill(st, small_oracle.tokens[:CUT], chunk=CHUNK)
    return st.snapshot().to_bytes()


def _rejects(model, data, match):
    with pytest.raises(ValueError, match=match):
        K.Snapshot.from_bytes(model, data)


def test_restore_rejects_random_and_truncated(small_oracle, blob):
    m = small_oracle.model()
    rng = np.random.default_rng(0)
    for size in (0, 3, 8, 100, len(blob)):
        _rejects(m, rng.integers(0, 256, size, dtype=np.uint8).tobytes(), "snapshot")
    for cut in (4, 12, 20, 40, 60, len(blob) // 2, len(blob) - 9, len(blob) - 1):
        _rejects(m, blob[:cut], "snapshot")
    _rejects(m, blob + b"\0", "checksum|trailing")


def test_restore_rejects_corruption_and_version(small_oracle, blob):
    m = small_oracle.model()
    for at in (len(blob) // 4, len(blob) // 2, len(blob) - 20):   # the tail, the page group
        bad = bytearray(blob)
        bad[at] ^= 0x40
        _rejects(m, bytes(bad), "checksum")
    bad = bytearray(blob)
    bad[0:8] = b"NOTCAIRN"
    _rejects(m, bytes(bad), "magic")
    bad = bytearray(blob)
    bad[8:12] = (K.SNAPSHOT_VERSION + 1).to_bytes(4, "little")
    _rejects(m, bytes(bad), "version")
    bad[8:12] = (2).to_bytes(4, "little")   # a whole-state blob from before paged state
    _rejects(m, bytes(bad), "version 2 .*before paged state")


def test_from_parts_checks_the_pages(small_oracle):
    m = small_oracle.model(page_tokens=16)
    st = K.State(m)
    K.prefill(st, small_oracle.tokens[:2 * m.page_tokens + 5], chunk=CHUNK)
    snap = st.snapshot()
    tail, pages = snap.tail(), [bytes(snap.page(k)) for k in range(snap.n_full_pages)]
    assert len(pages) == 2 and all(len(p) == m.page_nbytes for p in pages)
    assert K.Snapshot.from_parts(m, tail, pages).to_bytes() == snap.to_bytes()
    with pytest.raises(K.KernelError, match="needs 2 page groups, got 1"):
        K.Snapshot.from_parts(m, tail, pages[:1])
    with pytest.raises(K.KernelError, match="page group 1 has"):
        K.Snapshot.from_parts(m, tail, [pages[0], pages[1][:-4]])
    with pytest.raises(K.KernelError, match="out of range"):
        snap.page(2)
    other = small_oracle.model(page_tokens=2 * m.page_tokens)
    with pytest.raises(K.KernelError, match="pages hold"):
        K.Snapshot.from_parts(other, tail, pages)
    with pytest.raises(ValueError, match="page_tokens must be a positive multiple"):
        small_oracle.model(page_tokens=6)


def test_restore_rejects_foreign_fingerprint(small_oracle, blob):
    other = K.Model(small_oracle.config, small_oracle.weights, "someone-else", 1)
    with pytest.raises(K.KernelError, match="different model"):
        K.Snapshot.from_bytes(other, blob)
    snap = K.Snapshot.from_bytes(small_oracle.model(), blob)
    with pytest.raises(K.KernelError, match="different model"):
        K.State.restore(other, snap)


def test_restore_rejects_none_model_and_strided_buffer(small_oracle, blob):
    with pytest.raises((ValueError, TypeError)):
        K.Snapshot.from_bytes(None, blob)
    arr = np.frombuffer(blob, dtype=np.uint8)[::2]
    with pytest.raises(ValueError, match="contiguous"):
        K.Snapshot.from_bytes(small_oracle.model(), memoryview(arr))
    # bytearray and memoryview of a contiguous buffer are accepted
    assert K.Snapshot.from_bytes(small_oracle.model(), bytearray(blob)).n_tokens == CUT
    assert K.Snapshot.from_bytes(small_oracle.model(), memoryview(blob)).n_tokens == CUT
