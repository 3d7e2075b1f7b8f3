"""Decode's matrix product on GGUF blocks against the machine's read bandwidth, side by side in one run.

    .venv/bin/python bench/gguf_gemv.py [--types Q8_0,MXFP4,...] [--threads 2] [--mbytes 256] [--rounds 3]

Per type: one K = 4096 matrix of random blocks (tests/native/test_ggml_panels.py's random_blocks) holding
about --mbytes MB as stored, far beyond the last-level cache, multiplied by one row (decode's M = 1)
through the block panels the model uses (`_ggml_matmul`); best of 5 calls. Reported: GB/s of the stored
bytes, G weights/s, and the share of the STREAM-style read probe (bench/kernel.py's stream_read_gbs, same
threads), which is measured between types, alternating, so both see the same machine. The fp32 row is the
same product on fp32 panels (4 bytes a weight), for scale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

import cairn._kernel as K

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "native"))
from kernel import stream_read_gbs  # noqa: E402
from test_ggml_panels import QUANT, random_blocks  # noqa: E402

COLS = 4096


def one_type(qtype: str, mbytes: int, threads: int, rng) -> tuple[float, float]:
    """(GB/s of stored bytes, G weights/s) of the best of 5 M = 1 products."""
    if qtype == "F32":
        rows = mbytes * 10**6 // (COLS * 4) // 16 * 16
        w = rng.standard_normal((rows, COLS), dtype=np.float32)
        x = rng.standard_normal((1, COLS), dtype=np.float32)
        dt = min(K._packed_matmul(x, w, threads, 1)[1] for _ in range(5))
        return w.nbytes / dt / 1e9, rows * COLS / dt / 1e9
    block, nbytes = GGML_QUANT_SIZES[T[qtype]]
    row_bytes = COLS // block * nbytes
    rows = mbytes * 10**6 // row_bytes // 16 * 16
    blocks = random_blocks(qtype, rows * COLS // block, rng).reshape(rows, row_bytes)
    x = rng.standard_normal((1, COLS), dtype=np.float32)
    dt = min(K._ggml_matmul(x, blocks, qtype, threads, 1)[1] for _ in range(5))
    return blocks.nbytes / dt / 1e9, rows * COLS / dt / 1e9


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default=",".join(QUANT + ["F32"]))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mbytes", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    types = args.types.split(",")
    rng = np.random.default_rng(0)
    print(f"kernel build {K.ISA}, {args.threads} threads, {args.mbytes} MB a matrix, K = {COLS}, M = 1")
    best: dict[str, tuple[float, float, float]] = {}
    for r in range(args.rounds):
        for qt in types:
            probe = stream_read_gbs(args.threads)
            gbs, gws = one_type(qt, args.mbytes, args.threads, rng)
            print(f"round {r}: {qt:8s} {gbs:6.1f} GB/s  {gws:6.1f} Gw/s   probe {probe:5.1f} GB/s", flush=True)
            if qt not in best or gbs > best[qt][0]:
                best[qt] = (gbs, gws, probe)
    print(f"\n| type | bytes/weight | GB/s | G weights/s | read probe GB/s | share of probe |\n|---|---|---|---|---|---|")
    for qt in types:
        gbs, gws, probe = best[qt]
        print(f"| {qt} | {gbs / gws:.3f} | {gbs:.1f} | {gws:.1f} | {probe:.1f} | {gbs / probe:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
