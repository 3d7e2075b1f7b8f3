"""A quantized flash-slice fully in memory: load, RSS, decode against the bandwidth bound,
prefill against the FMA rate, and quantized panels against the same model in fp32 panels.

    cairn make-model --preset flash-slice --layers 2 /tmp/flash2
    .venv/bin/python bench/quant_slice.py /tmp/flash2 --threads 2

Bytes read per decoded token: every tensor a token touches once (attention, compressors,
indexer, router, shared expert, hyper-connections, the head), plus top-k routed experts per
layer, as stored (codes + scales). The bandwidth probe reads a 1 GiB array with as many threads
(an integer max: vectorised, memory-bound; numpy reductions release the GIL), best of 5. FLOPs per prefilled token: 2 per weight parameter
the token multiplies (the same set without the head, which runs for a chunk's last token only;
attention scores are left out, small at these lengths), against a pure FMA loop (`_fma_peak`) and
the kernel's own fp32 GEMM rate. Then bit-identity checks on the slice (identity_checks).
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import numpy as np

import cairn._kernel as K
from cairn.daemon.weights.model_dir import load_model, open_model_dir


def rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))


def read_probe(threads: int, nbytes: int = 1 << 30) -> float:
    a = np.ones(nbytes // 8, dtype=np.uint64)
    parts = np.array_split(a, threads)
    best = 0.0
    for _ in range(5):
        ts = [threading.Thread(target=np.max, args=(p,)) for p in parts]
        t = time.perf_counter()
        for x in ts:
            x.start()
        for x in ts:
            x.join()
        best = max(best, nbytes / (time.perf_counter() - t))
    return best


def gemm_rate(threads: int) -> float:
    """FLOP/s of the kernel's fp32 packed GEMM on a 512 x 4096 x 4096 product, best of 3: the
    compute reference for prefill (the micro-kernel at its best shape)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 4096), dtype=np.float32)
    w = rng.standard_normal((4096, 4096), dtype=np.float32)
    return max(2 * 512 * 4096 * 4096 / K._packed_matmul(x, w, threads, 2)[1] for _ in range(3))


def identity_checks(model, vocab: int) -> dict:
    """On the slice itself: any chunking, decode, and snapshot -> bytes -> restore -> continue give the
    same bits (the fp32 reference on dequantized weights is checked on the tiny presets in the tests;
    the slice's dequantized fp32 weights would need 26 GB)."""
    toks = np.random.default_rng(1).integers(0, vocab, 96).astype(np.int32)
    ref = K.prefill(K.State(model), toks, chunk=96, all_logits=True)[1]
    chunked = K.prefill(K.State(model), toks, chunk=37, all_logits=True)[1]
    st = K.State(model)
    rows = [K.prefill(st, toks[:50], chunk=16, all_logits=True)[1]]
    # through the serialized form, as a disk restore goes (an in-memory restore shares the groups)
    restored = K.State.restore(model, K.Snapshot.from_bytes(model, st.snapshot().to_bytes()))
    rows.append(K.prefill(restored, toks[50:80], chunk=64, all_logits=True)[1])
    rows += [K.decode(restored, int(t))[None] for t in toks[80:]]
    return {"chunk_37_equals_96": bool(np.array_equal(chunked, ref)),
            "split_restore_decode_equals_96": bool(np.array_equal(np.concatenate(rows), ref))}


def per_token(md) -> tuple[int, int]:
    """(bytes read per decoded token, weight parameters a prefilled token multiplies -- the head
    only runs for a chunk's last token)."""
    cfg, k = md.config, md.config["num_experts_per_tok"]
    nbytes = params = 0
    for name, t in md.tensors.items():
        size = t.end - t.start
        n = int(np.prod(t.shape)) * (2 if t.dtype == "I8" else 1)
        if name == "embed.weight" or name.endswith("tid2eid"):
            continue
        if ".ffn.experts." in name:
            size, n = size * k / cfg["n_routed_experts"], n * k / cfg["n_routed_experts"]
        nbytes += size
        if len(t.shape) == 2 and t.dtype != "F8_E8M0" and name != "head.weight":
            params += n
    return int(nbytes), int(params)


def timed_run(model, prompt, decode_n: int, chunk: int):
    st = K.State(model)
    t = time.perf_counter()
    _, logits = K.prefill(st, prompt, chunk=chunk)
    prefill_s = time.perf_counter() - t
    tok = int(logits.argmax())
    t = time.perf_counter()
    for _ in range(decode_n):
        tok = int(K.decode(st, tok).argmax())
    return len(prompt) / prefill_s, decode_n / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()

    md = open_model_dir(args.model)
    stored = sum(t.end - t.start for t in md.tensors.values())
    before, t = rss(), time.perf_counter()
    model = load_model(md, args.threads)
    load_s, grown = time.perf_counter() - t, rss() - before
    nbytes, params = per_token(md)
    bw, gemm = read_probe(args.threads), gemm_rate(args.threads)
    peak = max(K._fma_peak(args.threads, 0.5) for _ in range(3))
    same = identity_checks(model, md.config["vocab_size"])
    prompt = np.random.default_rng(0).integers(0, md.config["vocab_size"], args.prompt).astype(np.int32)
    runs = [timed_run(model, prompt, args.decode, args.chunk) for _ in range(args.runs)]
    prefill, decode = max(r[0] for r in runs), max(r[1] for r in runs)
    out = {
        "model": md.name, "layers": md.config["num_hidden_layers"], "threads": args.threads,
        "stored_GB": stored / 1e9, "load_s": round(load_s, 1), "rss_grown_GB": grown / 1e9,
        "rss_over_stored": round(grown / stored, 3),
        "bytes_per_token_GB": nbytes / 1e9, "read_probe_GBs": bw / 1e9,
        "decode_tok_s": round(decode, 2), "decode_bound_tok_s": round(bw / nbytes, 2),
        "decode_of_bound": round(decode * nbytes / bw, 3),
        "prefill_tok_s": round(prefill, 2), "prefill_GFLOPs": round(prefill * 2 * params / 1e9, 1),
        "fp32_gemm_GFLOPs": round(gemm / 1e9, 1), "prefill_of_gemm": round(prefill * 2 * params / gemm, 3),
        "fma_peak_GFLOPs": round(peak / 1e9, 1), "prefill_of_peak": round(prefill * 2 * params / peak, 3),
        **same,
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
