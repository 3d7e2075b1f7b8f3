"""Routed experts paged from the packed cache file under a byte budget (expert_cache_bytes):

- logits, decode, decode_batch and snapshots are bit-identical to the resident model, for any
  chunking, at the minimum budget (a sliding window of slots + evictions) and at half the experts, with O_DIRECT reads
  and with the buffered + POSIX_FADV_DONTNEED fallback;
- a streaming pack writes the same packed file, byte for byte, as a resident pack;
- bad budgets / a missing packed path raise errors that name the argument;
- the policy replay gives hand-computed hit counts, and replaying the model's own routing trace
  gives exactly the model's counters (the kernel and the replay run the same policy code), with
  prefetch (hash layers' experts from the token ids, router lookahead) on and off;
- prefetch keeps its rules: it never evicts a busy, pinned or reserved slot, leaves one unpinned
  slot unreserved, and a call passes over wrong guesses without losing its window.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import cairn._kernel as K
from cairn.daemon.modelgen.make_model import make_model, preset_with
from cairn.daemon.weights.model_dir import load_model, map_weights, open_model_dir

E = 8  # routed experts per layer (tiny-fp4 has 4: too few to tell budgets apart)


class Tiny:
    def __init__(self, root):
        self.md = open_model_dir(make_model(preset_with("tiny-fp4", n_routed_experts=E), 5, root / "m"))
        self.root = root
        self.resident = self.model()
        self.info = self.resident.expert_cache_info()
        self.slot = self.info["slot_bytes"]
        self.k = self.md.config["num_experts_per_tok"]
        rng = np.random.default_rng(11)
        self.prompt = rng.integers(0, self.md.config["vocab_size"], 90).astype(np.int32)
        self.packed = str(root / "packed.bin")
        self.model(packed_cache=self.packed)  # a resident pack writes the file once

    def model(self, **kw) -> K.Model:
        return K.Model(self.md.config, map_weights(self.md), self.md.fingerprint, 2, **kw)

    def paged(self, slots: int, **kw) -> K.Model:
        kw.setdefault("packed_cache", self.packed)
        return self.model(expert_cache_bytes=slots * self.slot, **kw)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Tiny:
    return Tiny(tmp_path_factory.mktemp("experts"))


def run(model: K.Model, prompt: np.ndarray, chunk: int) -> tuple[np.ndarray, list[np.ndarray], bytes]:
    st = K.State(model)
    _, logits = K.prefill(st, prompt, chunk=chunk, all_logits=True)
    steps = [K.decode(st, t) for t in (3, 141, 77)]
    return logits, steps, st.snapshot().to_bytes()


def same(a, b) -> bool:
    return np.array_equal(a[0], b[0]) and all(np.array_equal(x, y) for x, y in zip(a[1], b[1])) and a[2] == b[2]


def test_layout_sizes(tiny):
    info = tiny.info
    assert info["budget_bytes"] == 0 and not info["paging"]
    assert info["experts_total"] == E * tiny.md.config["num_hidden_layers"]
    assert info["slot_bytes"] % 4096 == 0 and info["dense_bytes"] % 4096 == 0
    assert info["expert_bytes_total"] == info["experts_total"] * info["slot_bytes"]
    assert os.path.getsize(tiny.packed) == 4096 + info["dense_bytes"] + info["expert_bytes_total"]


@pytest.mark.parametrize("chunk", [1, 7, 32, 90])
@pytest.mark.parametrize("slots", ["min", "half"])
def test_paged_prefill_decode_snapshot_are_bit_identical(tiny, chunk, slots):
    n = tiny.k if slots == "min" else tiny.info["experts_total"] // 2
    paged = tiny.paged(n)
    info = paged.expert_cache_info()
    assert info["slots"] == n and info["paging"] and info["budget_bytes"] == n * tiny.slot
    want = run(tiny.resident, tiny.prompt, chunk)
    got = run(paged, tiny.prompt, chunk)
    assert same(want, got)
    stats = paged.expert_cache_stats()
    assert stats["misses"] > 0 and stats["evictions"] > 0


@pytest.mark.parametrize("policy", ["lru", "lrfu", "hotpin", "cycle"])
def test_every_policy_is_bit_identical(tiny, policy):
    # the policy only chooses slots; with a window of k + 1 slots every call slides and evicts
    paged = tiny.paged(tiny.k + 1, expert_policy=policy)
    assert same(run(tiny.resident, tiny.prompt, 32), run(paged, tiny.prompt, 32))
    assert paged.expert_cache_stats()["evictions"] > 0


def test_paged_decode_batch_and_restore_are_bit_identical(tiny):
    paged = tiny.paged(tiny.k + 1)

    def batch(model):
        states = []
        for i, n in enumerate((5, 17, 30)):
            st = K.State(model)
            K.prefill(st, tiny.prompt[i : i + n], chunk=16)
            states.append(st)
        out = [K.decode_batch(states, np.array([9, 10, 11], dtype=np.int32)) for _ in range(3)]
        return out, [s.snapshot().to_bytes() for s in states]

    want, got = batch(tiny.resident), batch(paged)
    assert all(np.array_equal(a, b) for a, b in zip(want[0], got[0]))
    assert want[1] == got[1]
    # a resident snapshot restored on the paged model continues with the same bits
    st_r = K.State.restore(tiny.resident, K.Snapshot.from_bytes(tiny.resident, want[1][0]))
    st_p = K.State.restore(paged, K.Snapshot.from_bytes(paged, want[1][0]))
    assert np.array_equal(K.decode(st_r, 4), K.decode(st_p, 4))


def test_direct_io_and_fadvise_fallback_give_the_same_bits(tiny, monkeypatch):
    want = run(tiny.resident, tiny.prompt, 32)
    direct = tiny.paged(tiny.k)
    assert direct.expert_cache_info()["direct_io"] is True  # disk filesystems and tmpfs (Linux >= 6.6) take O_DIRECT
    assert same(want, run(direct, tiny.prompt, 32))
    monkeypatch.setenv("CAIRN_EXPERT_DIRECT_IO", "0")
    buffered = tiny.paged(tiny.k)
    assert buffered.expert_cache_info()["direct_io"] is False
    assert same(want, run(buffered, tiny.prompt, 32))
    stats = buffered.expert_cache_stats()
    assert stats["bytes_read"] == (stats["misses"] + stats["prefetch_reads"] - stats["prefetch_dropped"]) * tiny.slot


def test_streaming_pack_writes_the_resident_pack_byte_for_byte(tiny):
    path = tiny.root / "streamed.bin"
    model = tiny.paged(tiny.k, packed_cache=str(path))
    assert model.packed_cache_written and not model.packed_from_cache
    assert path.read_bytes() == open(tiny.packed, "rb").read()
    assert same(run(tiny.resident, tiny.prompt, 32), run(model, tiny.prompt, 32))
    again = tiny.paged(tiny.k, packed_cache=str(path))  # a second start reads the dense part from the file
    assert again.packed_from_cache and not again.packed_cache_written


def test_budget_of_every_expert_is_resident(tiny):
    model = tiny.model(expert_cache_bytes=tiny.info["expert_bytes_total"])  # no packed path needed
    info = model.expert_cache_info()
    assert info["budget_bytes"] == 0 and not info["paging"]
    run(model, tiny.prompt[:10], 10)
    stats = model.expert_cache_stats()
    assert {"hits", "misses", "bytes_read", "prefetch_reads", "lookahead_guesses"} <= stats.keys()
    assert set(stats.values()) == {0}
    assert model.expert_prefetch is False
    with pytest.raises(ValueError, match="every expert is resident"):
        model.expert_prefetch = True


def test_bad_budgets_and_missing_packed_path_raise(tiny):
    minimum = tiny.k * tiny.slot
    with pytest.raises(ValueError, match=f"below the minimum of {minimum} bytes"):
        tiny.model(expert_cache_bytes=minimum - 1, packed_cache=tiny.packed)
    with pytest.raises(ValueError, match="packed_cache"):
        tiny.model(expert_cache_bytes=minimum)
    with pytest.raises(ValueError, match="expert_cache_bytes must be >= 0"):
        tiny.model(expert_cache_bytes=-1)
    with pytest.raises(ValueError, match="policy 'mru' is unknown \\(allowed: 'lru', 'lrfu', 'hotpin', 'cycle'\\)"):
        tiny.model(expert_cache_bytes=minimum, packed_cache=tiny.packed, expert_policy="mru")
    for bad in (0, 17, -2):
        with pytest.raises(ValueError, match=f"expert_readers must be in 1..16 .*got {bad}"):
            tiny.model(expert_cache_bytes=minimum, packed_cache=tiny.packed, expert_readers=bad)


@pytest.mark.parametrize("readers", [1, 16])
def test_reader_count_changes_no_bits(tiny, readers):
    model = tiny.paged(tiny.k, expert_readers=readers)
    assert model.expert_cache_info()["readers"] == readers
    assert tiny.paged(tiny.k).expert_cache_info()["readers"] == 4  # the default
    assert same(run(tiny.resident, tiny.prompt, 32), run(model, tiny.prompt, 32))


def test_load_model_passes_the_budget(tiny):
    model = load_model(tiny.md, 2, packed_cache=tiny.root / "dir", expert_cache_bytes=tiny.k * tiny.slot + 100)
    info = model.expert_cache_info()
    assert info["paging"] and info["slots"] == tiny.k and info["budget_bytes"] == tiny.k * tiny.slot + 100
    assert load_model(tiny.md, 2).expert_cache_info()["budget_bytes"] == 0


def replay(keys, steps, slots, policy, k=1, **cycle):
    return K.replay_expert_policy(np.array(keys, np.int64), np.array(steps, np.int64), slots, policy, k=k, **cycle)


def test_policy_replay_hand_computed():
    # 2 slots; hot key 1 three times, then 2 and 3 once each, then 1 again.
    # LRU: 1 miss, hit, hit; 2 miss; 3 miss evicts 1 (least recent); 1 miss -> 2 hits, 4 misses.
    # LRFU: 3 evicts 2 (count 1) instead of 1 (count ~2.1 after decay) -> 1 hits again: 3 hits.
    keys, steps = [1, 1, 1, 2, 3, 1], [0, 1, 2, 3, 4, 5]
    assert replay(keys, steps, 2, "lru") == {"hits": 2, "misses": 4, "evictions": 2, "releases": 0}
    assert replay(keys, steps, 2, "lrfu") == {"hits": 3, "misses": 3, "evictions": 1, "releases": 0}
    # one call of 3 distinct keys on 2 slots: 3 finds both slots busy, so the call releases its
    # oldest (1, once computed) and 3 takes that slot; a repeat within a call is no access
    r = replay([1, 2, 2, 3, 1], [0, 0, 0, 0, 1], 2, "lru")
    assert r == {"hits": 0, "misses": 4, "evictions": 2, "releases": 1}


def test_a_full_window_releases_its_oldest_slot_first():
    # LRFU, 2 slots: 1 is accessed in 4 calls (count ~3.9), 2 once. In the call (1, 2, 3), 3 finds
    # both slots busy; the pipelined call releases its oldest slot (1's: FIFO, so that the policy's
    # operations never depend on compute timing) and 3 evicts 1, although 2 has the lower count.
    # The last call's 1 then misses and evicts 2 (count 1, older than 3's). With the earlier waves
    # (release every slot of the call, then acquire) 3 evicted 2 and 1 hit: 4 hits, 3 misses.
    r = replay([1, 1, 1, 1, 2, 3, 1], [0, 1, 2, 3, 3, 3, 4], 2, "lrfu")
    assert r == {"hits": 3, "misses": 4, "evictions": 2, "releases": 1}


def test_hotpin_keeps_its_pinned_set_through_a_sweep():
    # 4 slots, k=1: hotpin pins the first 3 keys (at most 7/8 of the slots, leaving k unpinned);
    # 5 and 4 then take turns in the one unpinned slot, and 1, 2, 3 hit.
    # LRU: 1-4 miss, 5 evicts 1, 1 evicts 2, 4 hits, 2 evicts 3, 3 evicts 5 -> 1 hit.
    keys = [1, 2, 3, 4, 5, 1, 4, 2, 3]
    steps = list(range(len(keys)))
    assert replay(keys, steps, 4, "lru") == {"hits": 1, "misses": 8, "evictions": 4, "releases": 0}
    assert replay(keys, steps, 4, "hotpin") == {"hits": 3, "misses": 6, "evictions": 2, "releases": 0}
    # a call of 3 keys with 2 slots of which 1 (7's) is pinned: 9 finds the unpinned slot busy
    # (8's), the call releases 8's slot and 9 takes it; the pinned slot is never a victim
    r = replay([7, 8, 9, 7], [0, 1, 1, 2], 2, "hotpin")
    assert r == {"hits": 1, "misses": 3, "evictions": 1, "releases": 1}


def test_cycle_evicts_the_key_whose_layer_comes_round_last():
    # 3 layers of 2 experts (keys 0-1, 2-3, 4-5), one key per call, layers in turn; 2 slots.
    # Call 2 (layer 2, key 4) must evict 0 or 2, both used once: layer 0 runs next call, layer 1
    # in two, so cycle evicts 2 and key 0 hits in call 3; likewise call 5 evicts 2 (its layer
    # again the furthest) and 0 hits in call 6. LRU evicts the older key each time: no hit.
    keys, steps = [0, 2, 4, 0, 2, 4, 0], list(range(7))
    layers = {"n_layers": 3, "num_experts": 2}
    assert replay(keys, steps, 2, "cycle", **layers) == {"hits": 2, "misses": 5, "evictions": 3, "releases": 0}
    assert replay(keys, steps, 2, "lru") == {"hits": 0, "misses": 7, "evictions": 5, "releases": 0}


def test_cycle_gives_up_its_own_held_expert_in_a_sweep():
    # one layer of 4 experts, 2 slots, two calls sweeping all 4 (a prefill chunk). In call 1,
    # acquiring 1 finds 3 free (it may still come in this call: next use 0 calls away) and 0 held
    # (next use a whole turn away): the call releases 0 rather than evict 3; so again for 2, and
    # 3 hits. LRU keeps the most recent keys and hits nothing.
    keys, steps = [0, 1, 2, 3, 0, 1, 2, 3], [0, 0, 0, 0, 1, 1, 1, 1]
    r = replay(keys, steps, 2, "cycle", n_layers=1, num_experts=4)
    assert r == {"hits": 1, "misses": 7, "evictions": 5, "releases": 4}
    assert replay(keys, steps, 2, "lru")["hits"] == 0


def test_cycle_needs_the_layer_cycle():
    with pytest.raises(ValueError, match="'cycle' needs n_layers and num_experts"):
        replay([1], [0], 2, "cycle")
    with pytest.raises(ValueError, match="beyond n_layers \\* num_experts"):
        replay([1, 8], [0, 1], 2, "cycle", n_layers=2, num_experts=4)


def test_replay_rejects_bad_input():
    with pytest.raises(ValueError, match="same length"):
        replay([1, 2], [0], 2, "lru")
    with pytest.raises(ValueError, match="non-decreasing"):
        replay([1, 2], [1, 0], 2, "lru")
    with pytest.raises(ValueError, match="slots must be >= 1"):
        replay([1], [0], 0, "lru")
    with pytest.raises(ValueError, match="k must be in 1..slots"):
        replay([1], [0], 2, "lru", k=3)


@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("policy", ["lru", "lrfu", "hotpin", "cycle"])
@pytest.mark.parametrize("share", ["min", "half"])
def test_counters_match_the_route_trace_and_its_replay(tiny, policy, share, prefetch):
    # "min" (k + 1 slots): a 16-token chunk needs nearly every expert, so calls slide their window
    # (release the oldest, acquire the next) many times; the replay must still match exactly
    slots = tiny.k + 1 if share == "min" else tiny.info["experts_total"] // 2
    model = tiny.paged(slots, expert_policy=policy)
    assert model.expert_prefetch is True  # the default
    model.expert_prefetch = prefetch
    model.set_route_trace(True)
    run(model, tiny.prompt, 16)
    trace = model.take_route_trace()
    assert trace.dtype == np.int32 and trace.shape[1] == 3
    ahead = trace[:, 2] < 0  # prefetches offered to the policy: (next call, layer, -1 - expert)
    assert ahead.any() == prefetch
    calls = trace[~ahead]
    layers = tiny.md.config["num_hidden_layers"]
    assert np.array_equal(calls[:, 1], calls[:, 0] % layers)  # calls go through the layers in order
    # a prefetch is for the call it precedes, never another layer's
    assert np.array_equal(trace[ahead, 1], trace[ahead, 0] % layers)
    # each call's experts are distinct and sorted (index order)
    for c in np.unique(calls[:, 0]):
        e = calls[calls[:, 0] == c, 2]
        assert np.all(np.diff(e) > 0)
    stats = model.expert_cache_stats()
    assert stats["hits"] + stats["misses"] == len(calls)
    # a queued prefetch whose slot is reused before the read starts is dropped (timing decides that)
    reads = stats["misses"] + stats["prefetch_reads"] - stats["prefetch_dropped"]
    assert stats["bytes_read"] == reads * tiny.slot
    experts = np.where(ahead, -1 - trace[:, 2], trace[:, 2])
    keys = trace[:, 1].astype(np.int64) * E + experts
    r = K.replay_expert_policy(keys, trace[:, 0].astype(np.int64), slots, policy, k=tiny.k, n_layers=layers,
                               num_experts=E, prefetch=ahead)
    assert (r["hits"], r["misses"], r["evictions"]) == (stats["hits"], stats["misses"], stats["evictions"])
    assert (r["prefetch_reads"], r["prefetch_used"]) == (stats["prefetch_reads"], stats["prefetch_used"])
    assert model.take_route_trace().shape == (0, 3)
    assert stats["read_seconds"] > 0
    # wall time with a read in flight: positive, and at most the reads' summed durations (plus the
    # reader threads' lock hand-offs, microseconds each)
    assert 0 < stats["read_busy_seconds"] <= stats["read_seconds"] + 1e-3 * reads
    pinned = model.expert_cache_info()["pinned"]
    if policy == "hotpin":  # up to 7/8 of the slots, leaving k unpinned
        assert 0 < pinned <= min(slots * 7 // 8, slots - tiny.k)
    else:
        assert pinned == 0 if policy in ("lru", "cycle") else pinned <= slots // 4
    if prefetch and share == "half":
        # 12 slots, nothing or a quarter pinned: room to read ahead, and the lookahead's guesses are counted
        if policy != "hotpin":
            assert stats["prefetch_reads"] > 0 and 0 < stats["prefetch_used"] <= stats["prefetch_reads"]
        assert 0 <= stats["lookahead_right"] <= min(stats["lookahead_guesses"], stats["lookahead_keys"])
        assert stats["lookahead_keys"] > 0
    if not prefetch:
        assert stats["prefetch_reads"] == stats["lookahead_guesses"] == stats["lookahead_keys"] == 0


@pytest.mark.parametrize("chunk", [1, 16, 90])
@pytest.mark.parametrize("policy", ["lru", "hotpin", "cycle"])
def test_prefetch_changes_no_bits(tiny, chunk, policy):
    slots = tiny.info["experts_total"] // 2
    on = tiny.paged(slots, expert_policy=policy)
    off = tiny.paged(slots, expert_policy=policy)
    off.expert_prefetch = False
    want = run(tiny.resident, tiny.prompt, chunk)
    assert same(want, run(on, tiny.prompt, chunk))
    assert same(want, run(off, tiny.prompt, chunk))
    assert on.expert_cache_stats()["lookahead_guesses"] > 0


def ops(rows):
    """(key, step, is_prefetch) rows -> replay arguments."""
    keys, steps, ahead = zip(*rows)
    return np.array(keys, np.int64), np.array(steps, np.int64), np.array(ahead, bool)


def test_prefetch_rules_hand_computed():
    # 4 experts per layer; 4 slots, LRU (nothing pinned); k=3, so the window is max(k, slots / 8) = 3.
    P = True
    # call 0 (layer 0) takes keys 0, 1. Before call 1 (layer 1) the lookahead guesses 4, 5, 6: room
    # for 3 reservations (one slot stays unreserved), so 4 and 5 go to the free slots and 6 evicts
    # the least recent unreserved key, 0. Call 1 acquires 5 and 7: acquiring 5 ends 4's reservation
    # (the call passed it over), 5 hits; acquiring 7 ends 6's, and 7 evicts the least recent
    # unreserved slot (6's: prefetched at call 1's clock, the lowest slot of the equally recent ones).
    keys, steps, ahead = ops([(0, 0, 0), (1, 0, 0), (4, 1, P), (5, 1, P), (6, 1, P), (5, 1, 0), (7, 1, 0)])
    r = K.replay_expert_policy(keys, steps, 4, "lru", k=3, prefetch=ahead, num_experts=4)
    assert r["prefetch_reads"] == 3 and r["prefetch_used"] == 1
    assert (r["hits"], r["misses"]) == (1, 3)
    # the window: with k=1 (window max(1, 4 / 8) = 1) only the first guess is read ahead
    r = K.replay_expert_policy(keys, steps, 4, "lru", k=1, prefetch=ahead, num_experts=4)
    assert r["prefetch_reads"] == 1 and r["prefetch_used"] == 0 and (r["hits"], r["misses"]) == (0, 4)
    # room: with 2 slots, one stays unreserved: the second guess is refused, nothing is evicted
    keys, steps, ahead = ops([(0, 0, 0), (4, 1, P), (5, 1, P), (4, 1, 0)])
    r = K.replay_expert_policy(keys, steps, 2, "lru", k=1, prefetch=ahead, num_experts=4)
    assert r["prefetch_reads"] == 1 and r["prefetch_used"] == 1 and r["evictions"] == 0
    # a prefetch never evicts a busy slot: with a free slot it reads there and the call hits on it;
    # with every slot held by the call, it is refused and nothing is evicted
    keys, steps, ahead = ops([(0, 0, 0), (1, 0, 0), (2, 0, P), (2, 0, 0)])
    r = K.replay_expert_policy(keys, steps, 3, "lru", k=1, prefetch=ahead, num_experts=4)
    assert r["prefetch_reads"] == 1  # a free slot: no eviction
    keys, steps, ahead = ops([(0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 0, P)])
    r = K.replay_expert_policy(keys, steps, 3, "lru", k=1, prefetch=ahead, num_experts=4)
    assert r["prefetch_reads"] == 0 and r["evictions"] == 0
    # hotpin: pinned slots are never a prefetch's victim. 4 slots, k=1: 0, 1, 2 pinned; 3 in the
    # unpinned slot; a guess for layer 1 has no room (the one unpinned slot stays unreserved)
    keys, steps, ahead = ops([(0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 0, 0), (4, 1, P), (4, 1, 0)])
    r = K.replay_expert_policy(keys, steps, 4, "hotpin", k=1, prefetch=ahead, num_experts=4)
    assert r["prefetch_reads"] == 0 and (r["hits"], r["misses"]) == (0, 5)


def test_replay_prefetch_rejects_bad_input():
    keys, steps, ahead = ops([(0, 0, 0), (4, 1, True)])
    with pytest.raises(ValueError, match="num_experts .* must be >= 1"):
        K.replay_expert_policy(keys, steps, 2, "lru", prefetch=ahead)
    with pytest.raises(ValueError, match="prefetch must be a 1-D bool array"):
        K.replay_expert_policy(keys, steps, 2, "lru", prefetch=ahead[:1], num_experts=4)


def test_the_default_policy_is_cycle(tiny):
    # the policy's operations depend on the keys alone, so the same run gives the same counters:
    # no expert_policy given counts as cycle does (and not as hotpin, on this run)
    slots = tiny.info["experts_total"] // 2

    def counters(**kw):
        model = tiny.paged(slots, **kw)
        run(model, tiny.prompt, 16)
        s = model.expert_cache_stats()
        return s["hits"], s["misses"], s["evictions"]

    assert counters() == counters(expert_policy="cycle") != counters(expert_policy="hotpin")


def test_resident_counters_stay_zero(tiny):
    run(tiny.resident, tiny.prompt[:20], 8)
    assert tiny.resident.expert_cache_stats()["misses"] == 0
    assert tiny.resident.expert_cache_stats()["bytes_read"] == 0


def test_route_trace_started_midway_numbers_every_call(tiny):
    # calls are counted with tracing off too (an atomic, no lock), so a trace started later keeps
    # its place in the layer cycle; turned off, nothing more is recorded
    model = tiny.model()
    layers = tiny.md.config["num_hidden_layers"]
    run(model, tiny.prompt[:10], 10)  # one prefill chunk and three decode steps: 4 forwards
    assert model.take_route_trace().shape == (0, 3)
    model.set_route_trace(True)
    run(model, tiny.prompt[:10], 10)
    model.set_route_trace(False)
    trace = model.take_route_trace()
    assert trace[:, 0].min() == 4 * layers and trace[:, 0].max() == 8 * layers - 1
    assert np.array_equal(trace[:, 1], trace[:, 0] % layers)
    run(model, tiny.prompt[:10], 10)
    assert model.take_route_trace().shape == (0, 3)
