"""What a state's snapshots, restores and verify records hold, against the figures the kernel reports
for them (the daemon's memory plan adds those up); and a model without compressed layers, which
holds no page groups at all.

The memory checks run in a fresh process (RSS and its peak are per process) on the oracle's weights
with a 1024-token window: a live state's ring is then about 1.5 MB while a 10-token snapshot needs
some 30 kB of it, so a snapshot that copied (or first allocated) the whole ring would stand out."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import cairn._kernel as K

HERE = os.path.dirname(__file__)

MEMORY_SCRIPT = textwrap.dedent(f"""
    import gc, json, sys
    import numpy as np
    sys.path.insert(0, {HERE!r})
    import hf_oracle, cairn._kernel as K

    PAGE = 4096
    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * PAGE
    def peak_over(f):
        '''(result of f(), peak RSS during it minus RSS before it)'''
        gc.collect()
        open("/proc/self/clear_refs", "w").write("5")   # resets the peak (VmHWM) to the current RSS
        before = rss()
        out = f()
        hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
        return out, int(hwm.split()[1]) * 1024 - before

    _, cfg, w, fp, _ = hf_oracle.model_inputs("w16-hca16")
    cfg = dict(cfg, sliding_window=1024)   # the weights do not depend on the window
    m = K.Model(cfg, w, fp + "-w1024", 2)
    st = K.State(m)
    K.prefill(st, np.arange(10, dtype=np.int32))
    out = dict(tail_nbytes=st.tail_nbytes, live_nbytes=st.nbytes)

    blob = st.snapshot().to_bytes()
    tail, pages = st.snapshot().tail(), []
    for name, f in [("snapshot", st.snapshot), ("from_bytes", lambda: K.Snapshot.from_bytes(m, blob)),
                    ("from_parts", lambda: K.Snapshot.from_parts(m, tail, pages))]:
        snap, peak = peak_over(f)
        out[name] = dict(peak=peak, own=snap.own_nbytes, same=snap.to_bytes() == blob)

    N = 200
    gc.collect()
    base = rss()
    snaps = [st.snapshot() for _ in range(N)]
    out["growth"] = rss() - base
    out["own"] = snaps[0].own_nbytes
    out["copied"] = snaps[0].copied_nbytes
    del snaps
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def memory():
    # A fixed mmap threshold: every buffer of 64 kB or more (a window ring) is its own fresh mapping,
    # so what a call allocates shows in RSS whatever the heap had free before.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    r = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_snapshot_holds_what_it_counts(memory):
    """N snapshots of a 10-token state raise RSS by about N x own_nbytes: the figure counts what a
    snapshot holds (it holds only the used part of the window ring and compressor buffers)."""
    N = 200
    assert memory["own"] == memory["tail_nbytes"] == memory["copied"]
    assert memory["own"] < 64_000          # 10 tokens' rows, not the 1.5 MB ring
    # allocator overhead and the Python objects: well under a quarter on top
    assert memory["growth"] <= 1.25 * N * memory["own"] + 1_000_000, memory


@pytest.mark.parametrize("call", ["snapshot", "from_bytes", "from_parts"])
def test_taking_or_rebuilding_a_snapshot_allocates_no_throwaway_state(memory, call):
    """The peak RSS of one call stays within what the snapshot holds plus slack: no full-size State
    (1.5 MB of zeroed ring here) is built first and then overwritten."""
    got = memory[call]
    assert got["same"]
    assert got["peak"] <= got["own"] + 400_000, got


NO_COMPRESSION_SCRIPT = textwrap.dedent(f"""
    import sys
    import numpy as np
    sys.path.insert(0, {HERE!r})
    import hf_oracle, cairn._kernel as K

    _, cfg, w, fp, _ = hf_oracle.model_inputs("w16-hca16")
    cfg = dict(cfg, layer_types=["sliding_attention"] * len(cfg["layer_types"]))
    w = {{k: v for k, v in w.items() if ".compressor." not in k and ".indexer." not in k}}
    m = K.Model(cfg, w, fp + "-sliding", 2)
    assert m.page_nbytes == 0
    tokens = np.random.default_rng(5).integers(0, cfg["vocab_size"], 340, dtype=np.int32)
    cut = 300   # past a page's worth of tokens (256): the old kernel counted a full group here
    ref = K.State(m)
    _, ref_logits = K.prefill(ref, tokens, chunk=37, all_logits=True)

    st = K.State(m)
    K.prefill(st, tokens[:cut], chunk=37)
    assert len(st.page_ids) == 0
    snap = st.snapshot()
    assert snap.n_full_pages == 0 and len(snap.page_ids) == 0
    assert snap.nbytes == snap.own_nbytes == st.tail_nbytes
    blob = snap.to_bytes()
    assert len(blob) == len(snap.tail()) + 8
    for rebuilt in (K.Snapshot.from_bytes(m, blob), K.Snapshot.from_parts(m, snap.tail(), []),
                    K.Snapshot.from_parts(m, bytearray(snap.tail()), ()), snap):
        assert rebuilt.to_bytes() == blob and rebuilt.n_full_pages == 0
        r = K.State.restore(m, rebuilt)
        assert r.nbytes == st.nbytes
        _, logits = K.prefill(r, tokens[cut:], chunk=37, all_logits=True)
        assert np.array_equal(logits, ref_logits[cut:])
    print("ok")
""")


def test_a_model_without_compressed_layers_holds_no_page_groups():
    """Every layer sliding (a valid config): no page groups exist, none are counted, and snapshots go
    through to_bytes / from_bytes / from_parts and continue bit-identically. In a subprocess: the
    old kernel counted a full group that did not exist and to_bytes read it (a segfault)."""
    r = subprocess.run([sys.executable, "-c", NO_COMPRESSION_SCRIPT], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-3000:]}"
    assert r.stdout.strip().endswith("ok")


@pytest.mark.parametrize("via", ["from_bytes", "from_parts", "memory"])
def test_rebuilt_snapshots_restore_bit_identically(small_oracle, via):
    """A snapshot holds only its buffers' used prefixes and a restore gives the full buffers back:
    the restored state continues with the very bits of the one never stopped, at cuts inside the
    first window, the first HCA window and past a page."""
    m = small_oracle.model()
    toks = small_oracle.tokens
    ref = K.State(m)
    _, ref_logits = K.prefill(ref, toks[:340], chunk=37, all_logits=True)
    for cut in (3, 10, 21, 300):
        st = K.State(m)
        K.prefill(st, toks[:cut], chunk=37)
        snap = st.snapshot()
        assert snap.own_nbytes == st.tail_nbytes == snap.copied_nbytes
        if via == "from_bytes":
            snap = K.Snapshot.from_bytes(m, snap.to_bytes())
        elif via == "from_parts":
            snap = K.Snapshot.from_parts(m, snap.tail(), [snap.page(k) for k in range(snap.n_full_pages)])
        assert snap.own_nbytes == st.tail_nbytes
        r = K.State.restore(m, snap)
        assert r.snapshot().to_bytes() == st.snapshot().to_bytes()
        _, logits = K.prefill(r, toks[cut:340], chunk=37, all_logits=True)
        assert np.array_equal(logits, ref_logits[cut:])


@pytest.mark.parametrize("n_draft", [1, 5, 17])
def test_a_verify_record_stays_within_the_models_figure(small_oracle, n_draft):
    """Model.verify_journal_nbytes(S) bounds what verify of S tokens keeps until the state's next
    call, and the record is reserved at that size (it does not grow geometrically past it)."""
    m = small_oracle.model()
    st = K.State(m)
    K.prefill(st, small_oracle.tokens[:41], chunk=16)   # verify from a position inside every window
    figure = m.verify_journal_nbytes(n_draft)
    K.verify(st, small_oracle.tokens[41:41 + n_draft])
    assert st.rewindable == n_draft
    assert 0 < st.journal_nbytes <= figure
    # the logits rows alone are (S + 1) x V floats: the figure is not a loose guess
    assert figure >= 4 * (n_draft + 1) * m.vocab_size and st.journal_nbytes >= 4 * (n_draft + 1) * m.vocab_size
    K.rewind(st, n_draft - 1)
    assert st.journal_nbytes <= figure
    K.decode(st, 1)
    assert st.journal_nbytes == 0


def test_verify_journal_figure_rejects_bad_lengths(small_oracle):
    m = small_oracle.model()
    for bad in (0, -1, K.MAX_CHUNK + 1):
        with pytest.raises(ValueError, match=r"n_tokens must be in 1\.\."):
            m.verify_journal_nbytes(bad)
