"""Qwen3.5 forward pass (issue 43 step 4, no state reuse yet): tok/s of `_kernel.Qwen35Model.forward` at
real attention and Gated DeltaNet width (Qwen3.5-35B-A3B: D 2048, H 16 / Hkv 2 / Dh 256, nk 16 / nv 32,
dk = dv 128, K 4) with few layers and small experts, so it runs here; random weights.

    .venv/bin/python bench/qwen35_forward.py --threads 2
    .venv/bin/python bench/qwen35_forward.py --layers lin,lin,lin,full --lengths 1,64,512 --rounds 3

Each length is one call from an empty state (the whole sequence), median of --rounds after one warm-up.
--chunk n also times the same call fed n tokens at a time (the same bits; the cost of splitting).
--depth N also times each length as the extension of a state already N tokens deep (restored from a
snapshot each round, prefilled in chunks of 128 as the daemon does): what a later turn pays.
Prints a markdown table.

    .venv/bin/python bench/qwen35_forward.py --layers full --lengths 355 --depth 6152 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

import cairn._kernel as K

LONG = {"lin": "linear_attention", "full": "full_attention"}


def config(layers: list[str], experts: int, inter: int, vocab: int) -> dict:
    return dict(
        vocab_size=vocab, hidden_size=2048, num_hidden_layers=len(layers), layer_types=[LONG[x] for x in layers],
        num_attention_heads=16, num_key_value_heads=2, head_dim=256, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
        linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
        linear_num_value_heads=32, num_experts=experts, num_experts_per_tok=min(8, experts),
        moe_intermediate_size=inter, shared_expert_intermediate_size=inter, tie_word_embeddings=False)


def weights(c: dict, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    w: dict[str, np.ndarray] = {}
    D, V = c["hidden_size"], c["vocab_size"]

    def lin(name, out_f, in_f):
        w[name] = (rng.standard_normal((out_f, in_f), dtype=np.float32) / np.float32(np.sqrt(in_f)))

    def vec(name, n, mean=0.0, std=0.1):
        w[name] = (mean + std * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    w["embed_tokens.weight"] = rng.standard_normal((V, D), dtype=np.float32)
    lin("lm_head.weight", V, D)
    vec("norm.weight", D)
    nk, nv, dk, dv, Kc = (c[k] for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                         "linear_value_head_dim", "linear_conv_kernel_dim"))
    H, Hkv, Dh, E, I = (c[k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim", "num_experts",
                                       "moe_intermediate_size"))
    cd, vd = 2 * nk * dk + nv * dv, nv * dv
    for i, kind in enumerate(c["layer_types"]):
        p = f"layers.{i}."
        vec(p + "input_layernorm.weight", D)
        vec(p + "post_attention_layernorm.weight", D)
        if kind == "linear_attention":
            a = p + "linear_attn."
            lin(a + "in_proj_qkv.weight", cd, D)
            lin(a + "in_proj_z.weight", vd, D)
            lin(a + "in_proj_b.weight", nv, D)
            lin(a + "in_proj_a.weight", nv, D)
            w[a + "conv1d.weight"] = (0.5 * rng.standard_normal((cd, 1, Kc))).astype(np.float32)
            vec(a + "dt_bias", nv)
            w[a + "A_log"] = np.log(rng.uniform(0.01, 1.0, nv)).astype(np.float32)
            vec(a + "norm.weight", dv, 1.0)
            lin(a + "out_proj.weight", D, vd)
        else:
            a = p + "self_attn."
            lin(a + "q_proj.weight", 2 * H * Dh, D)
            lin(a + "k_proj.weight", Hkv * Dh, D)
            lin(a + "v_proj.weight", Hkv * Dh, D)
            lin(a + "o_proj.weight", D, H * Dh)
            vec(a + "q_norm.weight", Dh)
            vec(a + "k_norm.weight", Dh)
        f = p + "mlp."
        lin(f + "gate.weight", E, D)
        for e in range(E):
            for proj, (o, n) in (("gate_proj", (I, D)), ("up_proj", (I, D)), ("down_proj", (D, I))):
                lin(f"{f}experts.{e}.{proj}.weight", o, n)
        for proj, (o, n) in (("gate_proj", (I, D)), ("up_proj", (I, D)), ("down_proj", (D, I))):
            lin(f"{f}shared_expert.{proj}.weight", o, n)
        lin(f + "shared_expert_gate.weight", 1, D)
    return w


def timed(fn, rounds: int) -> float:
    fn()  # warm-up
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default="lin,lin,lin,full", help="comma-separated lin / full (default: one 3:1 group)")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--inter", type=int, default=64, help="expert and shared-expert width")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--lengths", default="1,64,512")
    ap.add_argument("--chunk", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--depth", type=int, default=0, help="also time each length after this many tokens")
    a = ap.parse_args(argv)
    layers = a.layers.split(",")
    if any(x not in LONG for x in layers):
        ap.error("--layers takes lin and full, comma-separated")
    c = config(layers, a.experts, a.inter, a.vocab)
    t0 = time.perf_counter()
    m = K.Qwen35Model(c, weights(c, a.seed), threads=a.threads)
    load = time.perf_counter() - t0
    print(f"Qwen35Model, {K.ISA}, threads {m.threads}, layers {a.layers}, E {a.experts} x I {a.inter}, V {a.vocab}; "
          f"weights made and loaded in {load:.1f} s; load avg {os.getloadavg()[0]:.2f}\n")
    rng = np.random.default_rng(a.seed)
    snap = None
    if a.depth:   # one state a.depth tokens deep, restored for every timed extension
        st = K.State(m.model)
        K.prefill(st, rng.integers(0, a.vocab, a.depth).astype(np.int32), chunk=128)
        snap = st.snapshot()
    print("| tokens | call (ms) | tok/s |" + (f" chunk {a.chunk} (ms) |" if a.chunk else "")
          + (f" at depth {a.depth} (ms) | tok/s |" if a.depth else ""))
    print("|---:|---:|---:|" + ("---:|" if a.chunk else "") + ("---:|---:|" if a.depth else ""))
    for S in (int(x) for x in a.lengths.split(",")):
        ids = rng.integers(0, a.vocab, S).astype(np.int32)
        t = timed(lambda: m.forward(ids), a.rounds)
        row = f"| {S} | {t * 1e3:.1f} | {S / t:.1f} |"
        if a.chunk:
            row += f" {timed(lambda: m.forward(ids, chunk=a.chunk), a.rounds) * 1e3:.1f} |"
        if a.depth:
            ts = []
            for _ in range(a.rounds):
                deep = K.State.restore(m.model, snap)
                t0 = time.perf_counter()
                K.prefill(deep, ids, chunk=128)
                ts.append(time.perf_counter() - t0)
            td = statistics.median(ts)
            row += f" {td * 1e3:.1f} | {S / td:.1f} |"
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
