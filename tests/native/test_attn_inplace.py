"""Decode's attention reads its keys where they are, and a batched decode runs its states side by side.

- A block of one query (every decode step) packs none of its window, HCA or top-k key rows
  (`_attn_stats`: keys_packed 0), splits its work over the model's threads, and gives the same
  bits as the packed block path of a prefill over the same positions, on one thread or two.
- A batched decode of several states at depth runs their per-state work (ring, compressors,
  indexer, attention) in parallel (segment_parallel once per layer and step), bit-identical to
  decoding each alone, states included.

The model has the `small` preset's attention widths (16 heads of 128, window 128) so the work
passes the kernel's parallel threshold; rates are short so a few hundred tokens reach HCA entries
and a CSA top-k.
"""

from __future__ import annotations

import numpy as np
import pytest

import cairn._kernel as K
from cairn.daemon.modelgen.make_model import C, H, S, make_model, preset_with
from cairn.daemon.weights.model_dir import load_model

DEPTH = 300  # > window 128, 18 HCA entries (rate 16), 75 CSA entries (rate 4) > top-k 64


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    p = preset_with("small", vocab_size=512, hidden_size=256, layer_types=(S, H, C),
                    mlp_layer_types=("hash_moe", "moe", "moe"), n_routed_experts=4, num_experts_per_tok=2,
                    moe_intermediate_size=64, hca_rate=16)
    return make_model(p, 5, tmp_path_factory.mktemp("attn") / "m")


@pytest.fixture(scope="module")
def models(model_dir):
    return {t: load_model(model_dir, threads=t) for t in (1, 2)}


def _ids(n, seed=0):
    return np.random.default_rng(seed).integers(0, 512, n, dtype=np.int32)


def test_decode_packs_no_keys_and_matches_prefill(models):
    ids = _ids(DEPTH + 4)
    full = K.prefill(K.State(models[2]), ids, chunk=64, all_logits=True)[1]  # blocks of 16 queries
    for threads, m in models.items():
        st = K.State(m)
        K.prefill(st, ids[:DEPTH], chunk=64)
        K._attn_stats(True)
        got = np.stack([K.decode(st, int(t)) for t in ids[DEPTH:]])
        stats = K._attn_stats(True)
        assert stats["keys_packed"] == 0, stats
        assert stats["one_query"] == 4 * 3, stats  # every step, every layer
        if threads == 2:
            assert stats["one_query_parallel"] == 4 * 3, stats
        else:
            assert stats["one_query_parallel"] == 0, stats
        np.testing.assert_array_equal(got, full[DEPTH:], err_msg=f"threads={threads}")


def test_prefill_still_packs_and_its_last_block_of_one_matches(models):
    """The counter can fail: a chunk's blocks of 16 pack their keys. A chunk of 17 ends in a block
    of one query, which takes the in-place path inside the prefill, with the same bits."""
    ids = _ids(DEPTH + 17, seed=1)
    m = models[2]
    a, b = K.State(m), K.State(m)
    K.prefill(a, ids[:DEPTH], chunk=64)
    K.prefill(b, ids[:DEPTH], chunk=64)
    K._attn_stats(True)
    la = K.prefill(a, ids[DEPTH:], chunk=17, all_logits=True)[1]
    stats = K._attn_stats(True)
    assert stats["keys_packed"] > 0 and stats["one_query"] == 3, stats
    lb = K.prefill(b, ids[DEPTH:], chunk=5, all_logits=True)[1]
    np.testing.assert_array_equal(la, lb)
    assert a.snapshot().to_bytes() == b.snapshot().to_bytes()


def test_batched_decode_runs_states_in_parallel_with_equal_bits(models):
    m = models[2]
    prompts = [_ids(n, seed=2 + n) for n in (DEPTH, DEPTH + 37)]
    alone = [K.State(m) for _ in prompts]
    batched = [K.State(m) for _ in prompts]
    for st_a, st_b, p in zip(alone, batched, prompts):
        K.prefill(st_a, p, chunk=64)
        K.prefill(st_b, p, chunk=64)
    steps = _ids(10, seed=9).reshape(5, 2)
    for step in steps:
        want = np.stack([K.decode(st, int(t)) for st, t in zip(alone, step)])
        K._attn_stats(True)
        got = K.decode_batch(batched, step)
        stats = K._attn_stats(True)
        assert stats["segment_parallel"] == 3 and stats["keys_packed"] == 0, stats
        np.testing.assert_array_equal(got, want)
    for a, b in zip(alone, batched):
        assert a.snapshot().to_bytes() == b.snapshot().to_bytes()
