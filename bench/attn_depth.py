"""Decode's attention section at depth: ms a token of `_profile()`'s `attn` (the window, HCA and CSA
attention itself, not the projections or the indexer), one state alone and several states in one
batched decode, at each depth of one state extended chunk by chunk.

    .venv/bin/python bench/attn_depth.py /tmp/small --depths 8192 32768 --threads 2

The batch's other states are restored copies of the first (the same depth), fed other tokens. The
kernel's attention path counters (`_attn_stats`) are printed alongside: key floats packed per
decode token (0 when the keys are read in place) and how many calls ran their segments in parallel.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import cairn._kernel as K
from cairn.daemon.weights.model_dir import load_model


def _stats() -> dict:
    # a build without the counters (a "before" run) reports none
    get = getattr(K, "_attn_stats", None)
    return get(True) if get else {"keys_packed": -1, "segment_parallel": -1}


def _sections(n: int) -> dict:
    return {k: round(1e3 * v / n, 3) for k, v in K._profile(True).items()}


def run(model_dir: str, depths: list[int], threads: int, n_decode: int, batch: int, chunk: int, seed: int) -> list:
    model = load_model(model_dir, threads=threads)
    V = model.vocab_size
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, V, max(depths), dtype=np.int32)
    st = K.State(model)
    out = []
    for depth in sorted(depths):
        t0 = time.perf_counter()
        if st.n_tokens < depth:
            K.prefill(st, ids[st.n_tokens:depth], chunk=chunk)
        prefill_s = time.perf_counter() - t0
        snap = st.snapshot()
        toks = rng.integers(0, V, (n_decode, batch), dtype=np.int32)
        one = K.State.restore(model, snap)
        K._profile(True)
        _stats()
        t0 = time.perf_counter()
        for t in toks[:, 0]:
            K.decode(one, int(t))
        single_s = time.perf_counter() - t0
        single = _sections(n_decode)
        single_stats = _stats()
        states = [K.State.restore(model, snap) for _ in range(batch)]
        K._profile(True)
        t0 = time.perf_counter()
        for row in toks:
            K.decode_batch(states, row)
        batch_s = time.perf_counter() - t0
        batched = _sections(n_decode)  # per step (batch tokens)
        batch_stats = _stats()
        row = {"depth": depth, "prefill_s": round(prefill_s, 1),
               "single": {"ms_token": round(1e3 * single_s / n_decode, 2), "attn_ms": single["attn"],
                          "sections_ms": single, "stats": single_stats},
               "batch": {"states": batch, "ms_step": round(1e3 * batch_s / n_decode, 2), "attn_ms_step": batched["attn"],
                         "sections_ms": batched, "stats": batch_stats}}
        print(f"depth {depth:6d}: single attn {single['attn']:.3f} ms/token (token {row['single']['ms_token']} ms); "
              f"{batch} states batched attn {batched['attn']:.3f} ms/step (step {row['batch']['ms_step']} ms); "
              f"keys packed/token {single_stats['keys_packed'] / n_decode:.0f}, "
              f"segment-parallel calls {batch_stats['segment_parallel']}", flush=True)
        out.append(row)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", nargs="?", default="models/small")
    ap.add_argument("--depths", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decode", type=int, default=32, help="tokens decoded at each depth (each way)")
    ap.add_argument("--batch", type=int, default=2, help="states in the batched decode")
    ap.add_argument("--chunk", type=int, default=512, help="prefill chunk")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args(argv)
    rows = run(a.model_dir, a.depths, a.threads, a.decode, a.batch, a.chunk, a.seed)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
