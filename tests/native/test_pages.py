"""Paged state: compressed rows in shared, immutable page groups (native/include/cairn/pages.h).

Outputs do not depend on the page size; states and snapshots that share groups never see each
other's rows; a group lives as long as anything holds it; taking a snapshot copies no group."""

import gc

import numpy as np
import pytest

import cairn._kernel as K

P = 16  # small pages, so the oracle's 320-token prompt spans 20 groups


def _run(m, tokens, chunk, state=None):
    st = state if state is not None else K.State(m)
    n, logits = K.prefill(st, tokens, chunk=chunk, all_logits=True)
    assert n == len(tokens)
    return st, logits


@pytest.mark.parametrize("page_tokens", [16, 32, 48])
def test_outputs_do_not_depend_on_the_page_size(small_oracle, page_tokens):
    ref = _run(small_oracle.model(), small_oracle.tokens, 37)[1]
    got = _run(small_oracle.model(page_tokens=page_tokens), small_oracle.tokens, 37)[1]
    assert np.array_equal(got, ref)
    assert np.abs(got - small_oracle.ref_logits).max() <= 1e-4


def test_taking_a_snapshot_copies_no_group_and_the_state_copies_on_write(small_oracle):
    m = small_oracle.model(page_tokens=P)
    st, _ = _run(m, small_oracle.tokens[:100], 32)   # 6 full groups and a partial one
    base = K.page_pool()
    snap = st.snapshot()
    assert K.page_pool() == base                      # references only
    assert list(snap.page_ids) == list(st.page_ids) and len(snap.page_ids) == 7
    assert snap.copied_nbytes == snap.own_nbytes == snap.nbytes - 7 * m.page_nbytes
    frozen = snap.to_bytes()
    K.prefill(st, small_oracle.tokens[100:104], chunk=1)   # token 103 closes a CSA window: a row
    # the shared partial group was copied before the write: one group more, the full ones shared
    assert K.page_pool()["groups"] == base["groups"] + 1
    assert list(st.page_ids[:6]) == list(snap.page_ids[:6]) and st.page_ids[6] != snap.page_ids[6]
    K.prefill(st, small_oracle.tokens[104:300], chunk=64)
    assert snap.to_bytes() == frozen                  # nothing the state did reached the snapshot


def test_unshared_snapshot_holds_private_copies(small_oracle):
    m = small_oracle.model(page_tokens=P)
    st, _ = _run(m, small_oracle.tokens[:100], 32)
    base = K.page_pool()["groups"]
    snap = st.snapshot(share_pages=False)
    assert K.page_pool()["groups"] == base + 7
    assert not set(snap.page_ids) & set(st.page_ids)
    assert snap.copied_nbytes == snap.nbytes
    assert snap.to_bytes() == st.snapshot().to_bytes()


def test_a_group_lives_while_anything_holds_it(small_oracle):
    m = small_oracle.model(page_tokens=P)
    gc.collect()
    base = K.page_pool()
    st, _ = _run(m, small_oracle.tokens[:200], 50)
    uninterrupted = _run(m, small_oracle.tokens[200:], 50, _run(m, small_oracle.tokens[:200], 50)[0])[1]
    snap = st.snapshot()
    ids = list(snap.page_ids)
    del st
    gc.collect()
    assert K.page_pool()["groups"] == base["groups"] + len(ids)   # the snapshot keeps them all
    a = K.State.restore(m, snap)
    del snap
    gc.collect()
    assert list(a.page_ids) == ids                    # and now the restored state does
    assert np.array_equal(_run(m, small_oracle.tokens[200:], 50, a)[1], uninterrupted)
    del a
    gc.collect()
    assert K.page_pool() == base                      # the last reference freed them


def test_diverging_conversations_restored_in_alternation_never_see_each_other(small_oracle):
    """A shared prefix, then two branches (the prompt's tail, and the same tail reversed), each
    advanced a piece at a time from its own last snapshot, alternating: every logit equals the
    branch run straight through from a fresh state."""
    m = small_oracle.model(page_tokens=P)
    toks = small_oracle.tokens
    prefix, tail = toks[:70], toks[70:]
    branches = {"a": tail, "b": tail[::-1].copy()}
    straight = {k: _run(m, np.concatenate([prefix, t]), 23)[1][len(prefix):] for k, t in branches.items()}
    shared = _run(m, prefix, 23)[0].snapshot()
    snaps = {"a": shared, "b": shared}
    done = {"a": 0, "b": 0}
    pieces = [7, 16, 1, 29, 33, 2, 50, 13, 60, 39]       # crosses page boundaries at many offsets
    for i in range(60):
        k, step = "ab"[i % 2], pieces[(i // 2) % len(pieces)]
        t = branches[k]
        if done[k] >= len(t):
            continue
        st = K.State.restore(m, snaps[k])
        piece = t[done[k]:done[k] + step]
        _, logits = _run(m, piece, 1 + i % 17, st)
        assert np.array_equal(logits, straight[k][done[k]:done[k] + len(piece)]), (i, k)
        done[k] += len(piece)
        snaps[k] = st.snapshot()
    assert done == {"a": len(tail), "b": len(tail)}
    # the branches share exactly the groups the prefix filled
    a, b = list(snaps["a"].page_ids), list(snaps["b"].page_ids)
    full = len(prefix) // P
    assert a[:full] == b[:full] == list(shared.page_ids[:full])
    assert not set(a[full:]) & set(b[full:])


def test_batched_decode_of_states_sharing_groups(small_oracle):
    m = small_oracle.model(page_tokens=P)
    toks = small_oracle.tokens
    snap = _run(m, toks[:99], 32)[0].snapshot()      # 6 full groups; token 99 writes a row of group 6
    states = [K.State.restore(m, snap) for _ in range(3)]
    nxt = [int(toks[99]), int(toks[100]), int(toks[101])]
    solo = []
    for t in nxt:
        s = K.State.restore(m, snap)
        solo.append(K.decode(s, t))
    batch = K.decode_batch(states, nxt)
    for b in range(3):
        assert np.array_equal(batch[b], solo[b])
    # each wrote its own copy of the new group; the snapshot's groups are untouched
    new = {int(s.page_ids[-1]) for s in states}
    assert len(new) == 3 and not new & set(int(i) for i in snap.page_ids)
