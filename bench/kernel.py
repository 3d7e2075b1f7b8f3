"""Kernel benchmark: cairn._kernel vs HF transformers on the same model directory and threads.

    .venv/bin/python bench/kernel.py models/small --threads 2
    .venv/bin/python bench/kernel.py models/small --lengths 1024 --decode 16 --hf-max-len 1024

Reports prefill tok/s at each length (chunked, --chunk), decode tok/s after the longest
prefill, snapshot/restore time and size at the longest length, the kernel's fp32 GEMM GFLOP/s
(C[128x4096] = A[128x1024] B^T on the kernel's packed GEMM) and memory read bandwidth (M=1 GEMM
streaming 256 MB of packed weights),
with HF run through its own cached, chunked path for the same lengths (up to --hf-max-len).
Decode is also compared with its bandwidth bound: the bytes (4 per parameter; 2 for a bfloat16
directory, whose matrices the kernel keeps as BF16 panels unless --widen-bf16) of every weight one decode token
reads (decode_weight_bytes: attention, compressor, indexer and HC weights of every layer, the
router, the k routed experts + shared expert of every layer, the hyper-head and the LM head; the
embedding row is left out) divided into the measured read bandwidth. KV / compressed-state reads
are not weights and are not counted.

    .venv/bin/python bench/kernel.py --shape llama-peer

builds (once) and runs the shape of llama.cpp's published DeepSeek-V4 CPU figures (hidden 160,
7 layers, window 24, rates 4/128, 6 experts; see LLAMA_PEER) at 512 and 2048 tokens.
Prints a markdown table (paste into docs/benchmarks.md) and optionally writes JSON (--json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np


def _now() -> float:
    return time.perf_counter()


# llama.cpp's DeepSeek-V4 CPU anchor (/work/shared/docs/seed-and-anchors.md) gives hidden 160,
# 7 layers, window 24, rates 4/128, 6 experts, f32. The other fields are not published; these are
# our choices (V4-like proportions, llama.cpp's loader limits: hc_mult 4, indexer head dim >= 64).
LLAMA_PEER = dict(
    vocab_size=8192, hidden_size=160,
    layer_types=("sliding_attention", "sliding_attention", "compressed_sparse_attention",
                 "heavily_compressed_attention", "compressed_sparse_attention",
                 "heavily_compressed_attention", "compressed_sparse_attention"),
    mlp_layer_types=("hash_moe",) * 3 + ("moe",) * 4,
    num_attention_heads=4, head_dim=64, qk_rope_head_dim=32, q_lora_rank=64, o_groups=2, o_lora_rank=64,
    sliding_window=24, csa_rate=4, hca_rate=128, index_n_heads=4, index_head_dim=64, index_topk=16,
    n_routed_experts=6, num_experts_per_tok=2, moe_intermediate_size=128, hc_mult=4,
)
LLAMA_PEER_NUMBERS = {"llama.cpp": {512: 1456, 2048: 1159, "decode": 404},
                      "HF (their run)": {512: 1386, 2048: 593, "decode": 26}}


def ensure_llama_peer(path: str) -> str:
    from pathlib import Path

    if not (Path(path) / "config.json").exists():
        from cairn.daemon.make_model import make_model, preset_with

        make_model(preset_with("small", **LLAMA_PEER), 0, path)
    return path


def decode_weight_bytes(model_dir: str, widen_bf16: bool = False) -> dict:
    """Bytes of the weights one decode token reads, by group (see module docstring): 4 per
    parameter, 2 for a bfloat16 directory (the kernel keeps BF16 panels unless widen_bf16)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    elem = 2 if c.get("dtype", c.get("torch_dtype")) == "bfloat16" and not widen_bf16 else 4
    D, H, Dh = c["hidden_size"], c["num_attention_heads"], c["head_dim"]
    Rq, G, Ro = c["q_lora_rank"], c["o_groups"], c["o_lora_rank"]
    N, V = c.get("hc_mult", 4), c["vocab_size"]
    E, k, I = c["n_routed_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]
    ns = c.get("n_shared_experts", 1)
    nI, Di = c["index_n_heads"], c["index_head_dim"]
    rates = c["compress_rates"]
    f = {"attention": 0, "compressor": 0, "indexer": 0, "hc": 0, "router": 0, "experts": 0, "head": 0}
    for lt in c["layer_types"]:
        f["attention"] += Rq * D + H * Dh * Rq + Dh * D + G * Ro * (H * Dh // G) + D * G * Ro + Rq + Dh + H + 2 * D
        if lt == "compressed_sparse_attention":
            R = rates[lt]
            f["compressor"] += 2 * (2 * Dh * D) + R * 2 * Dh + Dh
            f["indexer"] += 2 * (2 * Di * D) + R * 2 * Di + Di + nI * Di * Rq + nI * D
        elif lt == "heavily_compressed_attention":
            R = rates[lt]
            f["compressor"] += 2 * (Dh * D) + R * Dh + Dh
        f["hc"] += 2 * ((2 + N) * N * N * D + (2 + N) * N + 3)
        f["router"] += E * D + E
        f["experts"] += (k + ns) * 3 * I * D
    f["head"] = V * D + N * N * D + N + 1 + D
    out = {key: elem * v for key, v in f.items()}
    out["total"] = sum(out.values())
    return out


def bench_gemm(threads: int) -> dict:
    """The machine's fp32 GEMM rate as the kernel's own packed GEMM reaches it (the GEMM every
    weight matrix runs on), and its memory read bandwidth."""
    import cairn._kernel as K

    rng = np.random.default_rng(0)
    a = rng.standard_normal((128, 1024), dtype=np.float32)
    b = rng.standard_normal((4096, 1024), dtype=np.float32)
    _, dt = K._packed_matmul(a, b, threads, 20)
    return {"gemm_gflops": 2 * 128 * 1024 * 4096 / dt / 1e9, "read_gbs": bench_read(threads)}


def bench_read(threads: int) -> float:
    """GB/s of the kernel's M=1 GEMM (decode's case) streaming 256 MB of packed fp32 weights
    (best of 5 calls)."""
    import cairn._kernel as K

    rng = np.random.default_rng(1)
    w = rng.standard_normal((65536, 1024), dtype=np.float32)  # 256 MB
    x = rng.standard_normal((1, 1024), dtype=np.float32)
    best = min(K._packed_matmul(x, w, threads, 1)[1] for _ in range(5))
    return w.nbytes / best / 1e9


def bench_kernel(path: str, threads: int, lengths: list[int], chunk: int, n_decode: int,
                 widen_bf16: bool = False) -> dict:
    import cairn._kernel as K
    from cairn.daemon.model_dir import load_model

    t = _now()
    model = load_model(path, threads=threads, widen_bf16=widen_bf16)
    out: dict = {"load_s": _now() - t, "prefill": {}}
    rng = np.random.default_rng(0)
    state = None
    for n in lengths:
        tokens = rng.integers(0, model.vocab_size, n, dtype=np.int32)
        state = K.State(model)
        K._profile(True)
        t = _now()
        done, logits = K.prefill(state, tokens, chunk=chunk)
        dt = _now() - t
        assert done == n
        out["prefill"][n] = {"tok_s": n / dt, "s": dt,
                             "sections_s": {k: round(v, 3) for k, v in K._profile(True).items()}}
        print(f"  kernel prefill {n:6d}: {n / dt:8.1f} tok/s ({dt:.2f} s)", file=sys.stderr)
    tok = int(logits.argmax())
    # read bandwidth right before and after the decode run (the machine's load changes by the
    # minute); the bound uses the higher of the two
    out["read_gbs_adjacent"] = [bench_read(threads)]
    K._profile(True)
    t = _now()
    for _ in range(n_decode):
        tok = int(K.decode(state, tok).argmax())
    dt = _now() - t
    out["decode_tok_s"] = n_decode / dt
    out["decode_at"] = lengths[-1]
    out["decode_sections_s"] = {k: round(v, 3) for k, v in K._profile(True).items()}
    out["read_gbs_adjacent"].append(bench_read(threads))
    t = _now()
    blob = state.snapshot()
    out["snapshot_s"] = _now() - t
    out["snapshot_bytes"] = len(blob)
    out["state_nbytes"] = state.nbytes
    t = _now()
    restored = K.State.restore(model, blob)
    out["restore_s"] = _now() - t
    assert restored.n_tokens == state.n_tokens
    out["snapshot_at"] = state.n_tokens
    return out


def bench_hf(path: str, threads: int, lengths: list[int], chunk: int, n_decode: int) -> dict:
    import torch
    from transformers import DeepseekV4ForCausalLM

    torch.set_num_threads(threads)
    model = DeepseekV4ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    rng = np.random.default_rng(0)
    out: dict = {"prefill": {}}
    cache = None
    with torch.no_grad():
        for n in lengths:
            ids = torch.tensor(rng.integers(0, vocab, n)[None])
            cache = None
            t = _now()
            for s in range(0, n, chunk):
                r = model(input_ids=ids[:, s : s + chunk], cache=cache, use_cache=True)
                cache = r.past_key_values
            dt = _now() - t
            out["prefill"][n] = {"tok_s": n / dt, "s": dt}
            print(f"  HF     prefill {n:6d}: {n / dt:8.1f} tok/s ({dt:.2f} s)", file=sys.stderr)
        tok = r.logits[:, -1:].argmax(-1)
        t = _now()
        for _ in range(n_decode):
            r = model(input_ids=tok, cache=cache, use_cache=True)
            cache = r.past_key_values
            tok = r.logits[:, -1:].argmax(-1)
        out["decode_tok_s"] = n_decode / (_now() - t)
        out["decode_at"] = lengths[-1]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", nargs="?", help="model directory (default models/small, or "
                    "models/llama-peer with --shape llama-peer)")
    ap.add_argument("--shape", choices=["dir", "llama-peer"], default="dir",
                    help="llama-peer: build/run the llama.cpp comparison shape at 512 and 2048 tokens")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 8192])
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--decode", type=int, default=32, help="tokens to decode after the longest prefill")
    ap.add_argument("--hf-max-len", type=int, default=8192, help="skip HF above this length (0: no HF)")
    ap.add_argument("--widen-bf16", action="store_true",
                    help="a bfloat16 directory's matrices as fp32 panels (default: BF16 panels)")
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args(argv)
    if args.shape == "llama-peer":
        args.model_dir = ensure_llama_peer(args.model_dir or "models/llama-peer")
        if args.lengths == [1024, 4096, 8192]:
            args.lengths = [512, 2048]
    elif args.model_dir is None:
        args.model_dir = "models/small"
    # numpy's BLAS stays single-threaded (ours is the only pool while the kernel runs); torch keeps
    # its default OpenMP wait policy -- a passive one cost HF ~15 % at chunk 128
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)
    except ImportError:
        pass

    res: dict = {"machine": platform.processor() or platform.machine(), "threads": args.threads,
                 "chunk": args.chunk, "model_dir": args.model_dir, "widen_bf16": args.widen_bf16}
    res["gemm"] = bench_gemm(args.threads)
    res["kernel"] = bench_kernel(args.model_dir, args.threads, args.lengths, args.chunk, args.decode,
                                 args.widen_bf16)
    hf_lengths = [n for n in args.lengths if n <= args.hf_max_len]
    if hf_lengths:
        res["hf"] = bench_hf(args.model_dir, args.threads, hf_lengths, args.chunk, args.decode)

    k, h = res["kernel"], res.get("hf", {"prefill": {}})
    wb = decode_weight_bytes(args.model_dir, args.widen_bf16)
    gbs = max(k["read_gbs_adjacent"])
    bound = gbs * 1e9 / wb["total"]
    res["decode_bound"] = {"weight_bytes": wb, "bound_tok_s": bound, "ratio": k["decode_tok_s"] / bound}
    print(f"\n{args.model_dir}, {args.threads} threads, chunk {args.chunk}\n")
    print("| metric | cairn kernel | HF transformers (fp32 eager) |")
    print("|---|---|---|")
    for n in args.lengths:
        hv = h["prefill"].get(n)
        print(f"| prefill {n} tok/s | {k['prefill'][n]['tok_s']:.1f} | {hv['tok_s']:.1f} |" if hv else
              f"| prefill {n} tok/s | {k['prefill'][n]['tok_s']:.1f} | — |")
    print(f"| decode tok/s at {k['decode_at']} | {k['decode_tok_s']:.2f} | "
          f"{h['decode_tok_s']:.2f} |" if "decode_tok_s" in h else
          f"| decode tok/s at {k['decode_at']} | {k['decode_tok_s']:.2f} | — |")
    print(f"| snapshot at {k['snapshot_at']} | {k['snapshot_s'] * 1e3:.1f} ms, "
          f"{k['snapshot_bytes'] / 1e6:.2f} MB | — |")
    print(f"| restore at {k['snapshot_at']} | {k['restore_s'] * 1e3:.1f} ms | — |")
    print(f"| decode bandwidth bound (weights {wb['total'] / 1e6:.1f} MB/token at "
          f"{gbs:.1f} GB/s, read probe beside the decode run) | {bound:.1f} tok/s; measured = "
          f"{100 * k['decode_tok_s'] / bound:.0f} % of it | — |")
    print("| decode weight bytes by group (MB) | " +
          ", ".join(f"{key} {v / 1e6:.2f}" for key, v in wb.items() if key != "total") + " | — |")
    if args.shape == "llama-peer":
        for name, nums in LLAMA_PEER_NUMBERS.items():
            print(f"| {name} (published, same shape): prefill 512 / 2048, decode | "
                  f"{nums[512]} / {nums[2048]} / {nums['decode']} tok/s | — |")
    print(f"| fp32 GEMM 128x4096x1024 (kernel, packed) | {res['gemm']['gemm_gflops']:.1f} GFLOP/s | — |")
    print(f"| memory read (M=1 GEMM, 256 MB) | {res['gemm']['read_gbs']:.1f} GB/s | — |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
