"""Kernel benchmark: cairn._kernel against HF transformers, or against llama.cpp, on the same model.

    .venv/bin/python bench/kernel.py models/small --threads 2
    .venv/bin/python bench/kernel.py models/small --lengths 1024 --decode 16 --hf-max-len 1024
    .venv/bin/python bench/kernel.py models/small --peer llama.cpp --chunk 512 --rounds 2

Default (HF): prefill tok/s at each length (chunked, --chunk), decode tok/s after the longest prefill,
snapshot/restore time and size at the longest length (bytes referenced, and bytes copied: the page
groups are shared), for the kernel and then for HF transformers through its own cached, chunked path
on the same token ids (up to --hf-max-len). Both compute the logits of the last position only (HF
with logits_to_keep=1; the kernel never computes the others).

--peer llama.cpp: the kernel and llama.cpp (llama-server, built and fed an F32 GGUF of the same
directory by the llama-peer tools, see bench/llama_peer.py) on the same token ids, --rounds times,
alternating (kernel, llama.cpp, kernel, ...), prefill at each length (default 512 and 2048) and decode
after the longest; the 1-minute load average is recorded before each run (--wait-load waits for a
quiet machine first).

Machine limits, both modes: the kernel's fp32 GEMM rate (C[128x4096] = A[128x1024] B^T on its packed
product) and the memory read bandwidth of an independent STREAM-style probe (--threads numpy threads
each summing its slice of a 512 MB array; no kernel code), measured right before and after the decode
run. Decode is compared with its bandwidth bound: the bytes (4 per parameter; 2 for a bfloat16
directory, whose matrices the kernel keeps as BF16 panels unless --widen-bf16) of every weight one
decode token reads (decode_weight_bytes: attention, compressor, indexer and HC weights of every layer,
the router, the k routed experts + shared expert of every layer, the hyper-head and the LM head; the
embedding row is left out) divided into the probe's bandwidth. KV / compressed-state reads are not
weights and are not counted. The kernel's own M=1 product is reported beside it, for reference only.

Prints a markdown table (paste into the day's docs/benchmarks/<date>.md) and optionally writes JSON (--json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def _now() -> float:
    return time.perf_counter()


# A small, fast model in the shape of llama.cpp's published tiny DeepSeek-V4 CPU anchor (hidden 160,
# 7 layers, window 24, rates 4/128, 6 experts; the other fields are our choices within llama.cpp's
# loader limits). bench/daemon_overhead.py runs on it. No published figure is compared with it: a
# comparison with llama.cpp is `--peer llama.cpp`, on the same model in the same run.
TINY_ANCHOR_SHAPE = dict(
    vocab_size=8192, hidden_size=160,
    layer_types=("sliding_attention", "sliding_attention", "compressed_sparse_attention",
                 "heavily_compressed_attention", "compressed_sparse_attention",
                 "heavily_compressed_attention", "compressed_sparse_attention"),
    mlp_layer_types=("hash_moe",) * 3 + ("moe",) * 4,
    num_attention_heads=4, head_dim=64, qk_rope_head_dim=32, q_lora_rank=64, o_groups=2, o_lora_rank=64,
    sliding_window=24, csa_rate=4, hca_rate=128, index_n_heads=4, index_head_dim=64, index_topk=16,
    n_routed_experts=6, num_experts_per_tok=2, moe_intermediate_size=128, hc_mult=4,
)


def ensure_llama_peer(path: str) -> str:
    """Generate (once, seed 0) the TINY_ANCHOR_SHAPE model at path."""
    from pathlib import Path

    if not (Path(path) / "config.json").exists():
        from cairn.daemon.modelgen.make_model import make_model, preset_with

        make_model(preset_with("small", **TINY_ANCHOR_SHAPE), 0, path)
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


def gemm_gflops(threads: int) -> float:
    """The machine's fp32 GEMM rate as the kernel's own packed GEMM reaches it."""
    import cairn._kernel as K

    rng = np.random.default_rng(0)
    a = rng.standard_normal((128, 1024), dtype=np.float32)
    b = rng.standard_normal((4096, 1024), dtype=np.float32)
    _, dt = K._packed_matmul(a, b, threads, 20)
    return 2 * 128 * 1024 * 4096 / dt / 1e9


_PROBE: dict = {}


def stream_read_gbs(threads: int, nbytes: int = 512 << 20, repeat: int = 5) -> float:
    """STREAM-style read bandwidth, independent of the kernel: `threads` threads each sum their
    contiguous slice of an nbytes float32 array (16x this machine's L3; numpy releases the GIL in
    the reduction). GB/s of the best of `repeat` passes."""
    if _PROBE.get("key") != (threads, nbytes):
        a = np.ones(nbytes // 4, dtype=np.float32)
        _PROBE.update(key=(threads, nbytes), parts=np.array_split(a, threads), pool=ThreadPoolExecutor(threads))
    parts, pool = _PROBE["parts"], _PROBE["pool"]
    best = float("inf")
    for _ in range(repeat):
        t = _now()
        sums = list(pool.map(np.sum, parts))
        best = min(best, _now() - t)
    assert sum(sums) == nbytes // 4  # all ones: every element was read
    return nbytes / best / 1e9


def kernel_m1_gbs(threads: int) -> float:
    """GB/s of the kernel's M=1 product (decode's case) streaming 256 MB of packed fp32 weights (best
    of 5). Reported for reference: it is the kernel's own speed, so it is not the bound's probe."""
    import cairn._kernel as K

    rng = np.random.default_rng(1)
    w = rng.standard_normal((65536, 1024), dtype=np.float32)  # 256 MB
    x = rng.standard_normal((1, 1024), dtype=np.float32)
    best = min(K._packed_matmul(x, w, threads, 1)[1] for _ in range(5))
    return w.nbytes / best / 1e9


def prompts_for(vocab: int, lengths: list[int]) -> dict[int, np.ndarray]:
    """The token ids every system runs: one independent prompt per length, seed 0."""
    rng = np.random.default_rng(0)
    return {n: rng.integers(0, vocab, n, dtype=np.int32) for n in lengths}


def bench_kernel(model, threads: int, prompts: dict[int, np.ndarray], chunk: int, n_decode: int,
                 snapshot: bool = True) -> dict:
    import cairn._kernel as K

    out: dict = {"prefill": {}}
    lengths = sorted(prompts)
    state = None
    for n in lengths:
        state = K.State(model)
        K._profile(True)
        t = _now()
        done, logits = K.prefill(state, prompts[n], chunk=chunk)
        dt = _now() - t
        assert done == n
        out["prefill"][n] = {"tok_s": n / dt, "s": dt,
                             "sections_s": {k: round(v, 3) for k, v in K._profile(True).items()}}
        print(f"  kernel prefill {n:6d}: {n / dt:8.1f} tok/s ({dt:.2f} s)", file=sys.stderr)
    tok = int(logits.argmax())
    K._profile(True)
    t = _now()
    for _ in range(n_decode):
        tok = int(K.decode(state, tok).argmax())
    dt = _now() - t
    out["decode_tok_s"] = n_decode / dt
    out["decode_at"] = lengths[-1]
    out["decode_sections_s"] = {k: round(v, 3) for k, v in K._profile(True).items()}
    print(f"  kernel decode at {lengths[-1]}: {n_decode / dt:.1f} tok/s", file=sys.stderr)
    if snapshot:
        t = _now()
        snap = state.snapshot()
        out["snapshot_s"] = _now() - t
        out["snapshot_bytes"] = snap.nbytes           # everything it references (shared page groups too)
        out["snapshot_copied_bytes"] = snap.copied_nbytes   # what taking it copied: the tail
        out["state_nbytes"] = state.nbytes
        t = _now()
        restored = K.State.restore(model, snap)
        out["restore_s"] = _now() - t
        assert restored.n_tokens == state.n_tokens
        out["snapshot_at"] = state.n_tokens
    return out


def bench_hf(path: str, threads: int, prompts: dict[int, np.ndarray], chunk: int, n_decode: int) -> dict:
    """HF's cached, chunked path on the same ids. logits_to_keep=1: the LM head runs on the last
    position of each call only, as in the kernel (without it HF computes vocab-wide logits for every
    prompt position, work the kernel does not do)."""
    import torch
    from transformers import DeepseekV4ForCausalLM

    torch.set_num_threads(threads)
    model = DeepseekV4ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    out: dict = {"prefill": {}}
    lengths = sorted(prompts)
    with torch.no_grad():
        for n in lengths:
            ids = torch.from_numpy(prompts[n].astype(np.int64))[None]
            cache = None
            t = _now()
            for s in range(0, n, chunk):
                r = model(input_ids=ids[:, s : s + chunk], cache=cache, use_cache=True, logits_to_keep=1)
                cache = r.cache
            dt = _now() - t
            assert r.logits.shape[1] == 1
            out["prefill"][n] = {"tok_s": n / dt, "s": dt}
            print(f"  HF     prefill {n:6d}: {n / dt:8.1f} tok/s ({dt:.2f} s)", file=sys.stderr)
        tok = r.logits[:, -1:].argmax(-1)
        t = _now()
        for _ in range(n_decode):
            r = model(input_ids=tok, cache=cache, use_cache=True, logits_to_keep=1)
            cache = r.cache
            tok = r.logits[:, -1:].argmax(-1)
        out["decode_tok_s"] = n_decode / (_now() - t)
        out["decode_at"] = lengths[-1]
    return out


def wait_for_load(limit: float, max_wait: float) -> float:
    """Wait (polling every 10 s, at most max_wait s) until the 1-minute load average is below limit;
    returns the load average at the start of the run."""
    deadline = _now() + max_wait
    while limit > 0 and os.getloadavg()[0] >= limit and _now() < deadline:
        time.sleep(10)
    return os.getloadavg()[0]


def bound_row(label: str, tok_s: float, wb: dict, gbs: float) -> str:
    bound = gbs * 1e9 / wb["total"]
    return f"| {label} | {tok_s:.1f} tok/s = **{100 * tok_s / bound:.0f} %** of {bound:.1f} tok/s |"


def run_hf_mode(args, res: dict) -> None:
    from cairn.daemon.weights.model_dir import load_model

    t = _now()
    model = load_model(args.model_dir, threads=args.threads, widen_bf16=args.widen_bf16)
    res["kernel_load_s"] = _now() - t
    prompts = prompts_for(model.vocab_size, args.lengths)
    res["load_avg_start"] = os.getloadavg()[0]
    res["read_gbs_adjacent"] = [stream_read_gbs(args.threads)]
    k = res["kernel"] = bench_kernel(model, args.threads, prompts, args.chunk, args.decode)
    res["read_gbs_adjacent"].append(stream_read_gbs(args.threads))
    del model
    hf_prompts = {n: p for n, p in prompts.items() if n <= args.hf_max_len}
    if hf_prompts:
        res["hf"] = bench_hf(args.model_dir, args.threads, hf_prompts, args.chunk, args.decode)
    res["load_avg_end"] = os.getloadavg()[0]
    h = res.get("hf", {"prefill": {}})
    wb = res["decode_weight_bytes"]
    gbs = max(res["read_gbs_adjacent"])
    print(f"\n{args.model_dir}, {args.threads} threads, chunk {args.chunk}, load average "
          f"{res['load_avg_start']:.2f} -> {res['load_avg_end']:.2f}\n")
    print("| metric | cairn kernel | HF transformers (fp32 eager, logits_to_keep=1) | kernel / HF |")
    print("|---|---|---|---|")
    for n in args.lengths:
        kv, hv = k["prefill"][n]["tok_s"], h["prefill"].get(n, {}).get("tok_s")
        print(f"| prefill {n} tok/s | {kv:.1f} | {hv:.1f} | {kv / hv:.2f}× |" if hv else
              f"| prefill {n} tok/s | {kv:.1f} | — | |")
    hd = h.get("decode_tok_s")
    print(f"| decode tok/s after {k['decode_at']} | {k['decode_tok_s']:.2f} | "
          + (f"{hd:.2f} | {k['decode_tok_s'] / hd:.2f}× |" if hd else "— | |"))
    print(f"| snapshot / restore at {k['snapshot_at']} | {k['snapshot_s'] * 1e3:.1f} / "
          f"{k['restore_s'] * 1e3:.1f} ms, {k['snapshot_bytes'] / 1e6:.2f} MB ({k['snapshot_copied_bytes'] / 1e6:.2f} "
          f"MB copied, the rest shared pages) | — | |")
    print_limits(res, wb, gbs, {"cairn kernel": k["decode_tok_s"]})


def print_limits(res: dict, wb: dict, gbs: float, decode: dict[str, float]) -> None:
    print(f"\nDecode bandwidth bound: {wb['total'] / 1e6:.1f} MB of weights per token at {gbs:.1f} GB/s "
          f"(STREAM-style read probe, best of the probes beside the decode runs: "
          + ", ".join(f"{g:.1f}" for g in res["read_gbs_adjacent"]) + ") = "
          f"{gbs * 1e9 / wb['total']:.1f} tok/s\n")
    print("| decode | measured, share of the bound |")
    print("|---|---|")
    for name, v in decode.items():
        print(bound_row(name, v, wb, gbs))
    print("\n| machine | |")
    print("|---|---|")
    print("| decode weight bytes by group (MB) | " +
          ", ".join(f"{key} {v / 1e6:.2f}" for key, v in wb.items() if key != "total") + " |")
    print(f"| fp32 GEMM 128x4096x1024 (kernel's packed product) | {res['gemm_gflops']:.1f} GFLOP/s |")
    print(f"| memory read, STREAM-style probe (512 MB, {res['threads']} threads) | "
          f"{res['stream_read_gbs']:.1f} GB/s |")
    print(f"| memory read, kernel's M=1 product (256 MB; reference only) | {res['kernel_m1_gbs']:.1f} GB/s |")


def run_peer_mode(args, res: dict) -> None:
    import llama_peer as lp
    from cairn.daemon.weights.model_dir import load_model

    try:
        tools = lp.tools_dir(args.peer_tools)
        src = lp.llama_cpp_dir(tools, args.llama_cpp)
        gguf = lp.ensure_gguf(tools, src, args.model_dir, args.gguf)
    except lp.PeerError as e:
        raise SystemExit(f"bench/kernel.py --peer llama.cpp: {e}") from None
    res["gguf"] = str(gguf)
    model = load_model(args.model_dir, threads=args.threads, widen_bf16=args.widen_bf16)
    prompts = prompts_for(model.vocab_size, args.lengths)
    ids = {n: [int(x) for x in p] for n, p in prompts.items()}
    server = lp.LlamaServer(src, gguf, args.threads, args.chunk, max(args.lengths) + args.decode + 64,
                            args.server_log)
    res["llama_server_cmd"] = server.cmd
    runs: list[dict] = []
    res["read_gbs_adjacent"] = []
    try:
        for r in range(args.rounds):
            for system in ("cairn", "llama.cpp"):
                load = wait_for_load(args.wait_load, args.wait_max)
                print(f"round {r + 1} {system} (load {load:.2f}, {time.strftime('%H:%M:%S', time.gmtime())} UTC)",
                      file=sys.stderr)
                res["read_gbs_adjacent"].append(stream_read_gbs(args.threads))
                if system == "cairn":
                    out = bench_kernel(model, args.threads, prompts, args.chunk, args.decode, snapshot=False)
                else:
                    out = lp.run_llama(server, ids, args.decode)
                res["read_gbs_adjacent"].append(stream_read_gbs(args.threads))
                out.update(system=system, round=r + 1, load_avg=load, utc=time.strftime("%H:%M:%S", time.gmtime()))
                runs.append(out)
    finally:
        server.close()
    res["runs"] = runs
    wb = res["decode_weight_bytes"]
    gbs = max(res["read_gbs_adjacent"])
    print(f"\n{args.model_dir} ({gguf.name} for llama.cpp), {args.threads} threads, chunk = ubatch "
          f"{args.chunk}, {args.rounds} rounds alternating\n")
    cols = [f"prefill {n}" for n in args.lengths] + [f"decode after {max(args.lengths)}"]
    print("| run | load avg | " + " | ".join(cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    for o in runs:
        print(f"| {o['system']} #{o['round']} | {o['load_avg']:.2f} | "
              + " | ".join(f"{o['prefill'][n]['tok_s']:.1f}" for n in args.lengths)
              + f" | {o['decode_tok_s']:.1f} |")
    # median, and best: noise on a shared machine only ever slows a run down
    stat = {"median": statistics.median, "best": max}
    agg: dict = {}
    for name, f in stat.items():
        agg[name] = {}
        for system in ("cairn", "llama.cpp"):
            rs = [o for o in runs if o["system"] == system]
            v = {n: f(o["prefill"][n]["tok_s"] for o in rs) for n in args.lengths}
            v["decode"] = f(o["decode_tok_s"] for o in rs)
            agg[name][system] = v
            print(f"| **{system}, {name}** | | " + " | ".join(f"**{v[n]:.1f}**" for n in args.lengths)
                  + f" | **{v['decode']:.1f}** |")
        print(f"| cairn / llama.cpp, {name} | | " + " | ".join(
            f"{agg[name]['cairn'][n] / agg[name]['llama.cpp'][n]:.2f}×" for n in args.lengths + ["decode"]) + " |")
    res["median_tok_s"], res["best_tok_s"] = agg["median"], agg["best"]
    med = agg["median"]
    print_limits(res, wb, gbs, {"cairn kernel (median)": med["cairn"]["decode"],
                                "llama.cpp (median)": med["llama.cpp"]["decode"]})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", nargs="?", default="models/small", help="model directory (default models/small)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lengths", type=int, nargs="+",
                    help="prompt lengths (default 1024 4096 8192; 512 2048 with --peer)")
    ap.add_argument("--chunk", type=int, default=128, help="prefill chunk (llama.cpp: its ubatch)")
    ap.add_argument("--decode", type=int, default=32, help="tokens to decode after the longest prefill")
    ap.add_argument("--hf-max-len", type=int, default=8192, help="skip HF above this length (0: no HF)")
    ap.add_argument("--widen-bf16", action="store_true",
                    help="a bfloat16 directory's matrices as fp32 panels (default: BF16 panels)")
    ap.add_argument("--peer", choices=["hf", "llama.cpp"], default="hf",
                    help="what the kernel is compared with (default: HF transformers)")
    ap.add_argument("--rounds", type=int, default=2, help="--peer llama.cpp: alternating rounds")
    ap.add_argument("--wait-load", type=float, default=0.0,
                    help="--peer llama.cpp: before each run wait until the 1-minute load average is below this")
    ap.add_argument("--wait-max", type=float, default=600.0, help="longest wait for --wait-load, seconds")
    ap.add_argument("--peer-tools", help="the llama-peer tools (default ../shared/tools/llama-peer next to "
                    "the repository)")
    ap.add_argument("--llama-cpp", help="a built llama.cpp source folder (default: what build.sh prints)")
    ap.add_argument("--gguf", help="the model's F32 GGUF (default <model_dir>.f32.gguf, converted if absent)")
    ap.add_argument("--server-log", default="/tmp/cairn-bench-llama-server.log")
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args(argv)
    if args.lengths is None:
        args.lengths = [512, 2048] if args.peer == "llama.cpp" else [1024, 4096, 8192]
    args.lengths = sorted(args.lengths)
    if args.peer == "llama.cpp" and args.widen_bf16:
        ap.error("--widen-bf16 with --peer llama.cpp: the GGUF is F32; compare an fp32 directory")
    # numpy's BLAS stays single-threaded (ours is the only pool while the kernel runs); torch keeps
    # its default OpenMP wait policy -- a passive one cost HF ~15 % at chunk 128
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)
    except ImportError:
        pass

    res: dict = {"machine": platform.processor() or platform.machine(), "threads": args.threads,
                 "chunk": args.chunk, "model_dir": args.model_dir, "widen_bf16": args.widen_bf16,
                 "peer": args.peer, "lengths": args.lengths, "decode": args.decode}
    res["gemm_gflops"] = gemm_gflops(args.threads)
    res["stream_read_gbs"] = stream_read_gbs(args.threads)
    res["kernel_m1_gbs"] = kernel_m1_gbs(args.threads)
    res["decode_weight_bytes"] = decode_weight_bytes(args.model_dir, args.widen_bf16)
    if args.peer == "llama.cpp":
        run_peer_mode(args, res)
    else:
        run_hf_mode(args, res)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
