"""GGUF block types against fp32 panels on one model: a model directory's matrices replaced by random
blocks of each type (the weights whatever they decode to), side by side with the fp32 model of exactly
those weights (gguf.quants.dequantize), alternating; prefill and decode tok/s and the packed bytes.

    .venv/bin/python bench/gguf_blocks.py MODEL_DIR [--types Q4_K,Q2_K,...] [--threads 1] [--rounds 2]

With --threads 1 the times are CPU time (least disturbed by other work on the machine). Both models
compute the same bits (tests/native/test_ggml_panels.py); only the bytes read and the widening differ.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

import cairn._kernel as K
from cairn.daemon.weights.model_dir import map_weights, open_model_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "native"))
from test_ggml_panels import QUANT as ALL, random_blocks  # noqa: E402


def weights_of(md, qt: str, rng):
    block, nb = GGML_QUANT_SIZES[T[qt]]
    quant, ref = {}, {}
    for name, (arr, tag) in map_weights(md).items():
        if tag == "F32" and arr.ndim == 2 and arr.shape[1] % block == 0 and not name.endswith("ape"):
            r, c = arr.shape
            b = random_blocks(qt, r * c // block, rng)
            quant[name] = (b.reshape(r, c // block * nb), f"GGML:{qt}")
            ref[name] = (dequantize(b.reshape(-1), T[qt]).reshape(r, c).astype(np.float32), "F32")
        else:
            quant[name] = ref[name] = (arr, tag)
    return quant, ref


def measure(md, weights, threads: int, ids) -> dict:
    clock = time.process_time if threads == 1 else time.perf_counter
    m = K.Model(md.config, weights, md.fingerprint, threads)
    s = K.State(m)
    t = clock()
    K.prefill(s, ids, chunk=256)
    tp = clock() - t
    t = clock()
    for i in range(24):
        K.decode(s, int(ids[i]))
    td = clock() - t
    out = {"packed_mib": m.packed_bytes / 2**20, "prefill": len(ids) / tp, "decode": 24 / td}
    del s, m
    gc.collect()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--types", default=",".join(ALL))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    md = open_model_dir(args.model)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, md.config["vocab_size"], 256).astype(np.int32)
    print(f"{'type':8s} {'packed MiB':>10s} {'prefill':>9s} {'decode':>8s}   (fp32 of the same weights)  ratio p/d")
    for qt in args.types.split(","):
        quant, ref = weights_of(md, qt, rng)
        best = {"q": None, "f": None}
        for _ in range(args.rounds):
            for side, w in (("f", ref), ("q", quant)):
                r = measure(md, w, args.threads, ids)
                b = best[side]
                best[side] = r if b is None else {k: max(b[k], r[k]) for k in r}
        q, f = best["q"], best["f"]
        print(f"{qt:8s} {q['packed_mib']:10.1f} {q['prefill']:9.1f} {q['decode']:8.1f}   "
              f"({f['packed_mib']:.1f} MiB {f['prefill']:.1f} / {f['decode']:.1f})  "
              f"{q['prefill'] / f['prefill']:.2f} / {q['decode'] / f['decode']:.2f}", flush=True)
        del quant, ref
        gc.collect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
