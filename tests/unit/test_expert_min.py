"""bench/expert_min.py: Belady's MIN over the expert slots is the optimum of the replay's model —
hand-worked traces, an exhaustive search over every eviction choice, and no kernel policy
(lru, lrfu, hotpin, cycle) beating it on random or recorded routing."""

from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import expert_min  # noqa: E402

POLICIES = ("lru", "lrfu", "hotpin", "cycle")


def one_per_call(keys):
    return np.asarray(keys, np.int64), np.arange(len(keys), dtype=np.int64)


def replay(keys, steps, slots, policy, k=1, layers=0, experts=0):
    from cairn import _kernel

    return _kernel.replay_expert_policy(np.asarray(keys, np.int64), np.asarray(steps, np.int64), slots, policy, k=k,
                                        n_layers=layers, num_experts=experts)


def brute_force(keys, steps, slots, hold):
    """The most hits over every schedule: each miss with full slots tries every evictable victim."""
    # the replay's accesses: each call's distinct keys, first-seen order
    req, seen = [], set()
    for key, call in zip(keys, steps):
        if (call, key) not in seen:
            seen.add((call, key))
            req.append((int(key), int(call)))
    # keys the kernel's discipline holds busy at each request ("call": the call's previous keys,
    # at most slots - 1 of them once the window slides; "release": none)
    protected = []
    for i, (_, call) in enumerate(req):
        same = [key for key, c in req[:i] if c == call]
        protected.append(frozenset(same[len(same) - (slots - 1):] if slots > 1 else []) if hold == "call"
                         else frozenset())

    @lru_cache(maxsize=None)
    def best(i, cache):
        if i == len(req):
            return 0
        key = req[i][0]
        if key in cache:
            return 1 + best(i + 1, cache)
        if len(cache) < slots:
            return best(i + 1, cache | {key})
        return max(best(i + 1, (cache - {v}) | {key}) for v in cache - protected[i])

    return best(0, frozenset())


def test_textbook_belady_example():
    # 3 frames on 7 0 1 2 0 3 0 4 2 3 0 3 2 1 2 0 1 7 0 1, one access per call: MIN misses on
    # 7 0 1 (cold), 2 (evicts 7, next used last), 3 (evicts 1), 4 (evicts 0), 0 (evicts 4, never
    # again), 1 (evicts 3, never again), 7 (evicts 2, never again): 9 misses, 11 hits
    keys, steps = one_per_call([7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1])
    for hold in expert_min.HOLDS:  # one key per call: nothing is ever held
        assert expert_min.min_hits(keys, steps, 3, hold=hold) == {"hits": 11, "misses": 9, "evictions": 6}
    assert brute_force(list(keys), list(steps), 3, "release") == 11
    # LRU on the same string: 12 misses (the textbook's count)
    assert replay(keys, steps, 3, "lru")["misses"] == 12


def test_a_held_key_is_not_a_victim_under_the_call_discipline():
    # 2 slots, calls {1}, {2, 3}, {1}. Releasing 2 (its output done) for 3 keeps 1: 1 hit.
    # Holding the call's keys, 3 must evict 1: no hit. Hotpin does release 2 (its one unpinned
    # slot is busy with it) and gets the hit: the "call" optimum does not bound hotpin.
    keys, steps = [1, 2, 3, 1], [0, 1, 1, 2]
    assert expert_min.min_hits(keys, steps, 2) == {"hits": 1, "misses": 3, "evictions": 1}
    assert expert_min.min_hits(keys, steps, 2, hold="call") == {"hits": 0, "misses": 4, "evictions": 2}
    assert replay(keys, steps, 2, "hotpin")["hits"] == 1
    assert replay(keys, steps, 2, "lru")["hits"] == 0


def test_repeats_within_a_call_are_no_access_and_the_cache_starts_empty():
    # one call 5, 5, 6, 5 then one call 6: accesses 5, 6 (misses), 6 (hit)
    r = expert_min.min_hits([5, 5, 6, 5, 6], [0, 0, 0, 0, 1], 2)
    assert r == {"hits": 1, "misses": 2, "evictions": 0}
    assert r["hits"] == replay([5, 5, 6, 5, 6], [0, 0, 0, 0, 1], 2, "lru")["hits"]
    assert expert_min.min_hits([], [], 3) == {"hits": 0, "misses": 0, "evictions": 0}


@pytest.mark.parametrize("hold", expert_min.HOLDS)
def test_matches_an_exhaustive_search(hold):
    rng = np.random.default_rng(3)
    checked = 0
    for _ in range(150):
        n = int(rng.integers(4, 13))
        keys = rng.integers(0, int(rng.integers(3, 7)), n)
        steps = np.sort(rng.integers(0, int(rng.integers(2, n + 1)), n))
        slots = int(rng.integers(1, 4))
        got = expert_min.min_hits(keys, steps, slots, hold=hold)
        assert got["hits"] == brute_force(keys.tolist(), steps.tolist(), slots, hold), (keys, steps, slots)
        checked += got["evictions"] > 0
    assert checked > 50  # most traces had real choices to make


def test_enough_slots_miss_only_on_first_touches():
    rng = np.random.default_rng(5)
    keys = rng.integers(0, 40, 600)
    steps = np.sort(rng.integers(0, 150, 600))
    accesses = len({(s, k) for s, k in zip(steps.tolist(), keys.tolist())})
    distinct = len(set(keys.tolist()))
    for hold in expert_min.HOLDS:
        for slots in (distinct, distinct + 7):
            r = expert_min.min_hits(keys, steps, slots, hold=hold)
            assert r == {"hits": accesses - distinct, "misses": distinct, "evictions": 0}
    assert expert_min.min_hits(keys, steps, distinct - 1)["evictions"] > 0


def random_routing(rng, layers, experts, k, calls, chunk_tokens):
    """A route trace like the kernel's: each call is one layer; its distinct experts sorted."""
    rows = []
    hot = rng.dirichlet(np.full(experts, 0.3), size=layers)  # skewed per-layer popularity
    for c in range(calls):
        layer = c % layers
        tokens = chunk_tokens if (c // layers) % 5 == 0 else 1  # a prefill chunk every 5 steps
        chosen = set()
        for _ in range(tokens):
            chosen.update(rng.choice(experts, size=k, replace=False, p=hot[layer]).tolist())
        rows += [(c, layer, e) for e in sorted(chosen)]
    return np.asarray(rows, np.int64)


def assert_min_bounds_the_policies(keys, steps, slots, k, layers, experts):
    bound = expert_min.min_hits(keys, steps, slots)
    held = expert_min.min_hits(keys, steps, slots, hold="call")
    assert held["hits"] <= bound["hits"]
    for policy in POLICIES:
        r = replay(keys, steps, slots, policy, k=k, layers=layers, experts=experts)
        assert r["hits"] + r["misses"] == bound["hits"] + bound["misses"]  # the same accesses
        assert r["hits"] <= bound["hits"], (policy, slots)
        if policy in ("lru", "lrfu"):  # these hold a call's keys as "call" does
            assert r["hits"] <= held["hits"], (policy, slots)
    return bound


def test_no_kernel_policy_beats_min_on_random_routing():
    rng = np.random.default_rng(7)
    layers, experts, k = 4, 16, 3
    trace = random_routing(rng, layers, experts, k, calls=400, chunk_tokens=12)
    keys, steps = trace[:, 1] * experts + trace[:, 2], trace[:, 0]
    gaps = 0
    for slots in (k, k + 1, 8, 16, 24, 40, 63):
        bound = assert_min_bounds_the_policies(keys, steps, slots, k, layers, experts)
        gaps += bound["hits"] > replay(keys, steps, slots, "lru", k=k)["hits"]
    assert gaps >= 5  # MIN strictly ahead of LRU at most budgets: the bound is not vacuous


def test_no_kernel_policy_beats_min_on_a_recorded_trace(tmp_path):
    import cairn._kernel as K
    from cairn.daemon.modelgen.make_model import make_model, preset_with
    from cairn.daemon.weights.model_dir import load_model, open_model_dir

    experts = 8
    md = open_model_dir(make_model(preset_with("tiny", n_routed_experts=experts), 2, tmp_path / "m"))
    cfg = md.config
    model = load_model(md, 2)
    rng = np.random.default_rng(1)
    model.set_route_trace(True)
    st = K.State(model)
    K.prefill(st, rng.integers(0, cfg["vocab_size"], 40).astype(np.int32), chunk=16)
    tok = 0
    for _ in range(12):
        tok = int(np.argmax(K.decode(st, tok)))
    model.set_route_trace(False)
    trace = model.take_route_trace()
    assert len(trace) > 0
    keys = trace[:, 1].astype(np.int64) * experts + trace[:, 2]
    steps = trace[:, 0].astype(np.int64)
    k = cfg["num_experts_per_tok"]
    total = experts * cfg["num_hidden_layers"]
    for slots in (k, k + 1, total // 4, total // 2, total):
        assert_min_bounds_the_policies(keys, steps, slots, k, cfg["num_hidden_layers"], experts)


def test_bad_input_names_the_field():
    with pytest.raises(ValueError, match="same length"):
        expert_min.min_hits([1, 2], [0], 2)
    with pytest.raises(ValueError, match=r"non-decreasing \(at index 1\)"):
        expert_min.min_hits([1, 2], [1, 0], 2)
    with pytest.raises(ValueError, match=r"keys\[1\] is negative"):
        expert_min.min_hits([1, -2], [0, 0], 2)
    with pytest.raises(ValueError, match="slots must be an integer >= 1"):
        expert_min.min_hits([1], [0], 0)
    with pytest.raises(ValueError, match="hold must be one of"):
        expert_min.min_hits([1], [0], 1, hold="pin")
    with pytest.raises(ValueError, match="must be integers"):
        expert_min.min_hits([1.5], [0], 1)
