"""Decode at agent depth (issue 41): prefill and decode of one state extended to 1k .. 128k tokens.

    .venv/bin/python bench/depth.py                                   # the flash-attn preset, 1k..128k
    .venv/bin/python bench/depth.py --depths 1024 8192 32768 --json depth.json
    .venv/bin/python bench/depth.py --model models/flash-slice-l2-3 --depths 1024 8192 32768 --json slice.json
    .venv/bin/python bench/depth.py --peer --project --slice-json slice.json --json depth.json
    .venv/bin/python bench/depth.py --project --slice-json slice.json --results a.json b.json   # no run

The model (default: `cairn make-model --preset flash-attn`, generated once into models/flash-attn):
V4-Flash's attention, compressor and indexer widths with small experts and vocabulary, so the work
that grows with the context is V4-Flash's per layer. The flash slice (`cairn make-model --preset
flash-slice --first-layer 2 --layers 2 models/flash-slice-l2-3`: V4-Flash's layers 2-3 in the
released format) gives the real per-layer cost of the fixed sections and the head.

One state is extended segment by segment to each depth of --depths, with a fixed id sequence
(--seed; ids 16.. so no special token). At each depth:
  prefill  the segment that reached it (chunks of --chunk), tok/s and the kernel's per-section
           seconds (`_kernel._profile()`: hc, qkv, compress, indexer, attn, out, router, experts, head)
           per token of the segment;
  decode   a snapshot, then --decode greedy tokens, their tok/s and per-section seconds per token;
           then the state is restored from the snapshot, so the next segment extends the prompt,
           not the decode.
With --decode-rounds R each depth's decode is taken R times (from the snapshot each time) and the
median round reported; with --quiet CORES each round first waits until processes other than this run
and its llama-server use fewer than CORES cores for 5 s (bench/quiet.py), and reports what they used
during it, so a long run's decodes stay quiet while its prefills share the machine.
Beside each depth's decode, the machine's fp32 matrix-product rate (bench/kernel.py's GEMM probe, the
kernel's packed product on --threads threads) and memory read bandwidth (its STREAM-style probe).

Rates of the work that grows with the context, per decode token:
  indexer  multiply-adds = CSA layers x (nI x Di x keys scored + its projections: wq_b, weights,
           the indexer compressor's wkv/wgate), keys scored = the entries visible (depth / rate),
           0 while they are <= top-k (then all are taken unscored); rate = those / the indexer
           section's seconds, as a share of the GEMM probe (2 FLOP per multiply-add). `marginal`:
           the same between the shallowest depth and this one (the scoring alone).
  HCA      bytes = HCA layers x entries (depth / 128) x head_dim x 4, the compressed rows read once;
           its seconds = the attn section's share by keys read (every layer's window, CSA's top-k,
           HCA's entries; a key costs the same multiply-adds in any layer): bytes / s against the
           read probe, and its multiply-adds (2 x heads x head_dim per key) against the GEMM probe.
Where the kernel has `_indexer_stats` (issue 41 §2), the key floats the indexer packed per token too.

--peer: llama.cpp on the same model (an F32 GGUF converted by bench/llama_peer.py, the shared
llama-peer tools), the same ids, alternating per depth (cairn's segment, then llama.cpp's): one
llama-server (1 slot, ubatch = --chunk, f32 KV, its context checkpoints on) fed ids[:depth] with
cache_prompt, so it resumes from its checkpoint near the previous depth (prompt_n of the server's
timings = the tokens it computed) and one token; each decode round is another request of the same
ids, resumed from its checkpoint 4 tokens before the end, of --decode + 1 tokens (the first is the
prompt's). The server is stopped (SIGSTOP) while cairn runs: an idle llama-server polls on a core.
--peer-slots DIR saves its slot at each depth (exactly ids[:depth], before any decode), and
--peer-resume DEPTH starts from the one saved at DEPTH: llama.cpp's prefill to 128k took 47 minutes
on a Zen 5 (to 64k: 14 minutes there, 45 on a Zen 3), so a deep pair can take a second sitting
(cairn recomputes its own: 6 minutes to 128k on the Zen 5, about 17 on the Zen 3).
Without llama.cpp's binaries it prints how to build them and runs cairn only.

--project: V4-Flash's resident decode tok/s at 1k, 64k, 128k and 1M on this machine. Method:
  t(n) = fixed + 21 x indexer_C(n) + attn(n), seconds per token at depth n, where
  fixed     = 43 x (hc + qkv + compress + out + router + experts per layer) + head, from --slice-json's
              shallowest decode (V4-Flash's own layers and format: FP8 projections, FP4 experts, the
              129,280-token head), or from this run's per-layer figures without it (fp32: slower);
  indexer_C = i0 + i1 x (nI x Di x keys scored at n), per CSA layer: both fitted (least squares) on this
              run's depths; i0 then replaced by the slice's indexer per CSA layer at a depth where it
              scored nothing (its projections in V4-Flash's format);
  attn(n)   = a0 x 43 + a1 x keys(n), keys(n) = 43 x min(n, 128) + 21 x min(n / 4, 512) + 20 x n / 128
              (V4-Flash: 21 CSA, 20 HCA, 2 sliding layers), a0 and a1 fitted on this run's depths;
  tok/s = 1 / t(n). 1M is an extrapolation (both fits are linear in the keys, as the code's work is).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from kernel import gemm_gflops, stream_read_gbs  # noqa: E402
from quiet import OtherCpu, wait_quiet  # noqa: E402

REPO = HERE.parent
C_, H_, S_ = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"
DEFAULT_DEPTHS = [1024, 8192, 32768, 65536, 131072]
FLASH_LAYERS = {C_: 21, H_: 20, S_: 2}   # V4-Flash's 43 layers by kind
PROJECT_AT = [1024, 65536, 131072, 1048576]
FIXED = ("hc", "qkv", "compress", "out", "router", "experts")   # per-layer sections that do not grow


def _now() -> float:
    return time.perf_counter()


class Shape:
    """The widths the work arithmetic needs, from a model directory's config.json."""

    def __init__(self, model_dir: str):
        with open(os.path.join(model_dir, "config.json")) as f:
            c = json.load(f)
        self.D, self.H, self.Dh, self.Rq = c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["q_lora_rank"]
        self.nI, self.Di, self.K, self.W = c["index_n_heads"], c["index_head_dim"], c["index_topk"], c["sliding_window"]
        self.csa, self.hca = c["compress_rates"][C_], c["compress_rates"][H_]
        self.kinds = {k: c["layer_types"].count(k) for k in (C_, H_, S_)}
        self.layers = len(c["layer_types"])
        self.vocab = c["vocab_size"]

    def scored(self, n: int) -> int:
        """Keys one CSA layer's indexer scores for a query seeing n tokens (none while all fit top-k)."""
        t = n // self.csa
        return t if t > self.K else 0

    def indexer_proj_macs(self) -> int:
        return self.nI * self.Di * self.Rq + self.nI * self.D + 2 * (2 * self.Di * self.D)

    def indexer_macs(self, n: int) -> int:
        """Indexer multiply-adds of one decode token at depth n, all CSA layers."""
        return self.kinds[C_] * (self.nI * self.Di * self.scored(n) + self.indexer_proj_macs())

    def prefill_indexer_macs(self, p: int, d: int) -> int:
        """The same summed over the prefill of positions p..d-1."""
        t = (np.arange(p, d, dtype=np.int64) + 1) // self.csa
        scored = int(np.where(t > self.K, t, 0).sum())
        return self.kinds[C_] * (self.nI * self.Di * scored + (d - p) * self.indexer_proj_macs())

    def keys(self, n: int, kinds: dict | None = None) -> int:
        """Keys attention reads for one query at depth n, every layer (window + CSA top-k + HCA entries)."""
        k = kinds or self.kinds
        return (sum(k.values()) * min(n, self.W) + k[C_] * min(n // self.csa, self.K) + k[H_] * (n // self.hca))

    def hca_entries(self, n: int) -> int:
        return self.kinds[H_] * (n // self.hca)


def _per(sec: dict, n: int) -> dict:
    return {k: v / n for k, v in sec.items()}


def probes(threads: int) -> dict:
    return {"gemm_gflops": gemm_gflops(threads), "read_gbs": stream_read_gbs(threads)}


def rates(shape: Shape, depth: int, dec: dict, base: dict | None, probe: dict) -> dict:
    """Achieved rates of the indexer and HCA's reads in one depth's decode (see the docstring)."""
    gflops, gbs = probe["gemm_gflops"], probe["read_gbs"]
    sec = dec["sections_s_per_token"]
    out: dict = {}
    macs = shape.indexer_macs(depth)
    if sec.get("indexer", 0) > 0 and shape.kinds[C_]:
        out["indexer_gmacs"] = macs / sec["indexer"] / 1e9
        out["indexer_of_gemm"] = 2 * out["indexer_gmacs"] / gflops
        if base is not None and depth > base["depth"]:
            dm = macs - shape.indexer_macs(base["depth"])
            ds = sec["indexer"] - base["cairn"]["decode"]["sections_s_per_token"]["indexer"]
            if dm > 0 and ds > 0:
                out["indexer_marginal_of_gemm"] = 2 * dm / ds / 1e9 / gflops
    ent = shape.hca_entries(depth)
    if ent and sec.get("attn", 0) > 0:
        s_hca = sec["attn"] * ent / shape.keys(depth)
        out["hca_s_per_token"] = s_hca
        out["hca_read_gbs"] = ent * shape.Dh * 4 / s_hca / 1e9
        out["hca_read_of_probe"] = out["hca_read_gbs"] / gbs
        out["hca_of_gemm"] = 2 * (2 * shape.H * shape.Dh * ent) / s_hca / 1e9 / gflops
    return out


def quiet_gate(own: list[int], cores: float) -> OtherCpu:
    """Wait for a quiet machine (bench/quiet.py); a meter of the others' cores from now."""
    waited = wait_quiet(own, cores)
    if waited > 10:
        print(f"  waited {waited:.0f} s for a quiet machine", file=sys.stderr)
    return OtherCpu(own)


def _median_round(rounds: list[dict]) -> dict:
    """The round of median tok/s, with every round's tok/s and others' cores beside it."""
    mid = sorted(rounds, key=lambda r: r["tok_s"])[(len(rounds) - 1) // 2]
    return {**mid, "rounds": [{"tok_s": r["tok_s"], "others_cores": r.get("others_cores")} for r in rounds]}


def kernel_segment(K, model, state, ids: np.ndarray, p: int, d: int, chunk: int, n_decode: int,
                   rounds: int = 1, gate=None):
    """Prefill ids[p:d] onto state, then `rounds` times: (gate()), decode n_decode greedy tokens from a
    snapshot, restore it. gate() waits for a quiet machine and returns a meter of the others' cores.
    Returns (the state at depth d, the segment's figures; decode = the median round)."""
    stats = getattr(K, "_indexer_stats", None)
    K._profile(True)
    t = _now()
    done, logits = K.prefill(state, ids[p:d], chunk=chunk)
    dt = _now() - t
    assert done == d - p and state.n_tokens == d, (done, state.n_tokens, d)
    pre = {"tokens": d - p, "s": dt, "tok_s": (d - p) / dt, "sections_s_per_token": _per(K._profile(True), d - p)}
    snap = state.snapshot()
    first = int(logits.argmax())
    decs = []
    for _ in range(rounds):
        meter = gate() if gate else None
        tok = first
        if stats:
            stats(True)
        K._profile(True)
        t = _now()
        for _ in range(n_decode):
            tok = int(K.decode(state, tok).argmax())
        dt = _now() - t
        dec = {"tokens": n_decode, "s": dt, "tok_s": n_decode / dt,
               "sections_s_per_token": _per(K._profile(True), n_decode)}
        if meter:
            dec["others_cores"] = meter.cores()
        if stats:
            dec["indexer_stats_per_token"] = _per(stats(True), n_decode)
        decs.append(dec)
        state = K.State.restore(model, snap)
        assert state.n_tokens == d
    return state, {"prefill": pre, "decode": _median_round(decs)}


# ---- llama.cpp ------------------------------------------------------------------------------------

def start_peer(args, n_ctx: int):
    """(llama_peer module, server) or (None, reason) when llama.cpp is not built or the GGUF fails."""
    import llama_peer as lp

    try:
        tools = lp.tools_dir(args.peer_tools)
        if args.llama_cpp:
            src = lp.llama_cpp_dir(tools, args.llama_cpp)
        else:
            # build.sh's default folder; checked here so that a missing build is reported, not started
            cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
            version = os.environ.get("LLAMA_CPP_PYTHON_VERSION", "0.3.36")
            src = Path(cache) / "llama-peer" / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
            if not os.access(src / "build" / "bin" / "llama-server", os.X_OK):
                return None, (f"llama.cpp is not built ({src}/build/bin/llama-server missing): build it with "
                              f"`nice -n 10 bash {tools}/build.sh` (~20 min on 2 cores) or pass --llama-cpp SRC")
        gguf = lp.ensure_gguf(tools, src, args.model, args.gguf)
        if args.peer_slots:
            Path(args.peer_slots).mkdir(parents=True, exist_ok=True)
        server = lp.LlamaServer(src, gguf, args.threads, args.chunk, n_ctx, args.server_log, extend=True,
                                slot_dir=args.peer_slots)
    except lp.PeerError as e:
        return None, str(e)
    return server, str(gguf)


def slot_name(gguf: str, seed: int, depth: int) -> str:
    """The file a llama-server slot at `depth` of this run's ids is saved as (--peer-slots)."""
    return f"{Path(gguf).stem}.seed{seed}.d{depth}.bin"


def peer_segment(server, ids: list[int], n_decode: int, rounds: int = 1, gate=None, save_as: str | None = None) -> dict:
    """ids (the whole prompt to this depth) with cache_prompt and one token: the server computes what its
    checkpoint does not hold (the segment's prefill; saved as `save_as` in its slot directory: exactly
    these ids). Then `rounds` decodes, each after gate(): the same ids again, resumed from the server's
    checkpoint 4 tokens before the end, and n_decode + 1 greedy tokens (the first is the prompt's)."""
    t = server.timings(ids, 1, cache_prompt=True)
    pre = {"tokens": t["prompt_n"], "cached": t.get("cache_n"), "s": t["prompt_ms"] / 1e3,
           "tok_s": t["prompt_n"] / (t["prompt_ms"] / 1e3)}
    if save_as:
        pre["saved"] = {"file": save_as, "tokens": server.slot_file("save", save_as)}
    decs = []
    for _ in range(rounds):
        meter = gate() if gate else None
        t = server.timings(ids, n_decode + 1, cache_prompt=True)
        if t["prompt_n"] > 64:
            raise RuntimeError(f"llama-server recomputed {t['prompt_n']} tokens of a repeated prompt (no checkpoint)")
        decs.append({"tokens": n_decode, "s": t["predicted_ms"] / 1e3, "tok_s": n_decode / (t["predicted_ms"] / 1e3),
                     "resumed_tokens": t["prompt_n"], **({"others_cores": meter.cores()} if meter else {})})
    return {"prefill": pre, "decode": _median_round(decs)}


# ---- projection -----------------------------------------------------------------------------------

def _fit(xs, ys) -> tuple[float, float]:
    """Least-squares (intercept, slope)."""
    b, a = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(a), float(b)


def project(shape: Shape, depths: list[dict], slice_res: dict | None) -> dict:
    """V4-Flash's resident decode tok/s at PROJECT_AT depths (method: the module docstring)."""
    sec = [(e["depth"], e["cairn"]["decode"]["sections_s_per_token"]) for e in depths]
    nC, L = shape.kinds[C_], shape.layers
    fl = FLASH_LAYERS
    # attention: attn(n) = a0 x layers + a1 x keys(n)
    X = np.array([[L, shape.keys(n)] for n, _ in sec], float)
    y = np.array([s["attn"] for _, s in sec])
    a0, a1 = (float(v) for v in (np.linalg.lstsq(X, y, rcond=None)[0] if len(sec) > 1 else (0.0, y[0] / X[0, 1])))
    # indexer per CSA layer: i0 + i1 x scoring multiply-adds, over every depth (those that score
    # nothing pin the intercept)
    xs = [shape.nI * shape.Di * shape.scored(n) for n, _ in sec]
    ys = [s["indexer"] / nC for _, s in sec]
    if len(set(xs)) > 1:
        i0, i1 = _fit(xs, ys)
    else:
        i0, i1 = (ys[0], 0.0) if xs[0] == 0 else (0.0, ys[0] / xs[0])
    src = "this run (its own weights' format)"
    fixed_layer = {k: sec[0][1].get(k, 0) / L for k in FIXED}
    head = sec[0][1].get("head", 0.0)
    if slice_res:
        s0 = min(slice_res["depths"], key=lambda e: e["depth"])
        ss, sl = s0["cairn"]["decode"]["sections_s_per_token"], slice_res["shape"]["layers"]
        fixed_layer = {k: ss.get(k, 0) / sl for k in FIXED}
        head = ss.get("head", 0.0)
        sshape = slice_res["shape"]
        if sshape["csa_layers"] and sshape["scored_at_shallowest"] == 0:
            i0 = ss["indexer"] / sshape["csa_layers"]
        src = f"{slice_res['model']} at {s0['depth']}"
    fixed = sum(fixed_layer.values()) * sum(fl.values()) + head
    out = {"fixed_from": src, "fixed_s": fixed, "fixed_per_layer_s": fixed_layer, "head_s": head,
           "attn_fit": {"a0_s_per_layer": a0, "a1_s_per_key": a1},
           "indexer_fit": {"i0_s_per_csa_layer": i0, "i1_s_per_mac": i1}, "at": {}}
    for n in PROJECT_AT:
        ind = fl[C_] * (i0 + i1 * shape.nI * shape.Di * shape.scored(n))
        att = a0 * sum(fl.values()) + a1 * shape.keys(n, fl)
        t = fixed + ind + att
        out["at"][n] = {"tok_s": 1 / t, "s": t, "indexer_s": ind, "attn_s": att}
    if i1 < 0 or a1 < 0:
        out["warning"] = ("a fitted cost per multiply-add or key is negative: the depths' timings are noise "
                          "(a loaded machine?); rerun on a quiet one")
    base = out["at"][PROJECT_AT[0]]["tok_s"]
    for n in PROJECT_AT:
        out["at"][n]["of_1k"] = out["at"][n]["tok_s"] / base
    return out


# ---- report ---------------------------------------------------------------------------------------

def _ms(v: float) -> str:
    return f"{v * 1e3:.2f}"


def print_report(res: dict) -> None:
    secs = [k for k in res["depths"][0]["cairn"]["decode"]["sections_s_per_token"]]
    peer = any("llama.cpp" in e for e in res["depths"])
    print(f"\n{res['model']}, {res['threads']} threads, chunk {res['chunk']}, {res['decode']} decode tokens a depth, "
          f"ids seed {res['seed']}\n")
    print("| depth | prefill tok/s (segment) | decode tok/s |" + (" llama.cpp prefill | llama.cpp decode | "
                                                               "decode cairn/llama |" if peer else "")
          + " GEMM GFLOP/s | read GB/s |")
    print("|---|---|---|" + ("---|---|---|" if peer else "") + "---|---|")
    for e in res["depths"]:
        c = e["cairn"]
        row = f"| {e['depth']} | {c['prefill']['tok_s']:.1f} ({c['prefill']['tokens']}) | {c['decode']['tok_s']:.2f} |"
        if peer:
            lp = e.get("llama.cpp")
            row += (f" {lp['prefill']['tok_s']:.1f} ({lp['prefill']['tokens']}) | {lp['decode']['tok_s']:.2f} | "
                    f"{c['decode']['tok_s'] / lp['decode']['tok_s']:.2f}× |" if lp else " — | — | |")
        print(row + f" {e['probe']['gemm_gflops']:.1f} | {e['probe']['read_gbs']:.1f} |")
    for e in res["depths"]:   # every decode round (the table has the median) and the others' cores in it
        rr = {who: e[who]["decode"]["rounds"] for who in ("cairn", "llama.cpp") if "rounds" in e.get(who, {}).get("decode", {})}
        if any(len(r) > 1 or r[0]["others_cores"] is not None for r in rr.values()):
            print(f"  {e['depth']}: decode rounds, tok/s (others' cores): " + "; ".join(
                who + " " + ", ".join(f"{r['tok_s']:.2f}" + (f" ({r['others_cores']:.2f})" if r["others_cores"] is not None
                                                               else "") for r in rounds)
                for who, rounds in rr.items()))
    for phase in ("decode", "prefill"):
        print(f"\n{phase}, ms a token by section\n")
        print("| depth | " + " | ".join(secs) + " |")
        print("|---|" + "---|" * len(secs))
        for e in res["depths"]:
            s = e["cairn"][phase]["sections_s_per_token"]
            print(f"| {e['depth']} | " + " | ".join(_ms(s.get(k, 0)) for k in secs) + " |")
    print("\n| depth | indexer rate (of GEMM) | indexer marginal (of GEMM) | HCA reads GB/s (of probe) | HCA "
          "multiply-adds (of GEMM) | indexer packed floats a token | prefill indexer (of GEMM) |")
    print("|---|---|---|---|---|---|---|")
    for e in res["depths"]:
        r = e["rates"]

        def pct(k):
            return f"{100 * r[k]:.0f} %" if k in r else "—"

        st = e["cairn"]["decode"].get("indexer_stats_per_token", {}).get("packed_floats")
        print(f"| {e['depth']} | {r.get('indexer_gmacs', 0):.1f} G/s ({pct('indexer_of_gemm')}) | "
              f"{pct('indexer_marginal_of_gemm')} | "
              + (f"{r['hca_read_gbs']:.1f} ({pct('hca_read_of_probe')})" if "hca_read_gbs" in r else "—")
              + f" | {pct('hca_of_gemm')} | {st if st is not None else '—'} | {pct('prefill_indexer_of_gemm')} |")
    if "projection" in res:
        p = res["projection"]
        print(f"\nV4-Flash resident decode, projected (fixed sections from {p['fixed_from']}: "
              f"{_ms(p['fixed_s'])} ms a token)\n")
        if "warning" in p:
            print(f"**{p['warning']}**\n")
        print("| depth | tok/s | of 1k | indexer ms | attn ms |")
        print("|---|---|---|---|---|")
        for n, v in p["at"].items():
            print(f"| {n} | {v['tok_s']:.2f} | {100 * v['of_1k']:.0f} % | {_ms(v['indexer_s'])} | {_ms(v['attn_s'])} |")


def report_results(args) -> int:
    """--results: earlier runs merged by depth, reported and projected as one run (long depths are runs
    of their own: a 128k state is most of an hour with llama.cpp beside it)."""
    runs = [json.loads(Path(f).read_text()) for f in args.results]
    models = {r["model"] for r in runs}
    if len(models) != 1:
        sys.exit(f"--results: the files are of different models ({', '.join(sorted(models))}); merge one model's")
    by_depth = {e["depth"]: e for r in runs for e in r["depths"]}
    res = {**runs[0], "depths": [by_depth[d] for d in sorted(by_depth)], "merged_from": list(args.results)}
    if args.project:
        slice_res = json.loads(Path(args.slice_json).read_text()) if args.slice_json else None
        res["projection"] = project(Shape(res["model"]), res["depths"], slice_res)
    print_report(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2, default=str))
    return 0


def ensure_model(args) -> str:
    if args.model:
        return args.model
    path = REPO / "models" / args.preset
    if not (path / "config.json").exists():
        from cairn.daemon.modelgen.make_model import make_model

        print(f"generating the {args.preset} preset into {path}", file=sys.stderr)
        make_model(args.preset, 0, path)
    return str(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model directory (default: the --preset generated into models/PRESET)")
    ap.add_argument("--preset", default="flash-attn", help="preset generated when --model is not given")
    ap.add_argument("--depths", type=int, nargs="+", default=DEFAULT_DEPTHS)
    ap.add_argument("--seed", type=int, default=0, help="seed of the id sequence")
    ap.add_argument("--decode", type=int, default=32, help="greedy decode tokens at each depth")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=512, help="prefill chunk (llama.cpp: its ubatch)")
    ap.add_argument("--peer", action="store_true", help="llama.cpp side by side, alternating per depth")
    ap.add_argument("--decode-rounds", type=int, default=1,
                    help="decode this many times at each depth (cairn from its snapshot, llama.cpp the same ids "
                         "again); the median round is reported")
    ap.add_argument("--quiet", type=float, metavar="CORES",
                    help="before each timed decode, wait until processes other than this run (and its "
                         "llama-server) use fewer than CORES cores for 5 s; each round reports their use")
    ap.add_argument("--peer-tools", help="the llama-peer tools (default ../shared/tools/llama-peer)")
    ap.add_argument("--llama-cpp", help="a built llama.cpp source folder (default: build.sh's cache folder)")
    ap.add_argument("--gguf", help="the model's F32 GGUF (default <model>.f32.gguf, converted if absent)")
    ap.add_argument("--server-log", default="/tmp/cairn-depth-llama-server.log")
    ap.add_argument("--peer-slots", metavar="DIR",
                    help="save llama-server's slot at each depth into DIR (exactly ids[:depth]), for --peer-resume")
    ap.add_argument("--peer-resume", type=int, metavar="DEPTH",
                    help="restore llama-server's slot saved at DEPTH (in --peer-slots, same GGUF and seed) and "
                         "leave llama.cpp out of the depths <= DEPTH: a long run continued in another sitting")
    ap.add_argument("--project", action="store_true", help="project V4-Flash's resident decode (see above)")
    ap.add_argument("--slice-json", help="--project: a depth.py JSON of the flash slice, for the fixed sections")
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--results", nargs="+", metavar="JSON",
                    help="run nothing: report (and --project) the depths of these earlier runs' --json files of "
                         "one model, merged (a later file's depth replaces an earlier one's)")
    args = ap.parse_args(argv)
    if args.results:
        return report_results(args)
    depths = sorted(set(args.depths))
    if depths[0] < 1:
        ap.error(f"--depths must be positive, got {depths[0]}")
    if args.peer_resume and not (args.peer and args.peer_slots):
        ap.error("--peer-resume needs --peer and --peer-slots (the directory its slot file is in)")
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)  # numpy's BLAS stays out of the kernel's way
    except ImportError:
        pass
    args.model = ensure_model(args)
    import cairn._kernel as K
    from cairn.daemon.weights.model_dir import load_model

    shape = Shape(args.model)
    rng = np.random.default_rng(args.seed)
    ids = rng.integers(16, shape.vocab, depths[-1], dtype=np.int32)
    res: dict = {"machine": platform.processor() or platform.machine(), "model": args.model,
                 "threads": args.threads, "chunk": args.chunk, "decode": args.decode, "seed": args.seed,
                 "shape": {"layers": shape.layers, "csa_layers": shape.kinds[C_], "hca_layers": shape.kinds[H_],
                           "scored_at_shallowest": shape.scored(depths[0])},
                 "depths": []}
    server = None
    if args.peer:
        server, what = start_peer(args, depths[-1] + args.decode + 64)
        if server is None:
            print(f"--peer: {what}; running cairn only", file=sys.stderr)
            res["peer_error"] = what
        else:
            res["gguf"], res["llama_server_cmd"] = what, server.cmd
            if args.peer_resume:
                got = server.slot_file("restore", slot_name(what, args.seed, args.peer_resume))
                if got != args.peer_resume:
                    sys.exit(f"--peer-resume: the slot file holds {got} tokens, not {args.peer_resume}")
                res["peer_resumed_from"] = args.peer_resume
    model = load_model(args.model, threads=args.threads)
    state = K.State(model)
    base = None
    own = [os.getpid()] + ([server.proc.pid] if server is not None else [])
    gate = (lambda: quiet_gate(own, args.quiet)) if args.quiet is not None else None
    try:
        p = 0
        for d in depths:
            print(f"depth {d} (load {os.getloadavg()[0]:.2f}, {time.strftime('%H:%M:%S', time.gmtime())} UTC)",
                  file=sys.stderr)
            e: dict = {"depth": d, "load_avg": os.getloadavg()[0]}
            if server is not None:   # stopped while cairn runs: an idle llama-server polls on a core
                os.kill(server.proc.pid, signal.SIGSTOP)
            state, e["cairn"] = kernel_segment(K, model, state, ids, p, d, args.chunk, args.decode,
                                               args.decode_rounds, gate)
            e["probe"] = probes(args.threads)
            if server is not None:
                os.kill(server.proc.pid, signal.SIGCONT)
            if server is not None and d > (args.peer_resume or 0):
                e["llama.cpp"] = peer_segment(server, [int(x) for x in ids[:d]], args.decode, args.decode_rounds,
                                              gate, slot_name(res["gguf"], args.seed, d) if args.peer_slots else None)
            e["rates"] = rates(shape, d, e["cairn"]["decode"], base, e["probe"])
            pi = e["cairn"]["prefill"]["sections_s_per_token"].get("indexer", 0)
            if pi > 0 and shape.kinds[C_]:
                m = shape.prefill_indexer_macs(p, d) / (d - p)
                e["rates"]["prefill_indexer_of_gemm"] = 2 * m / pi / 1e9 / e["probe"]["gemm_gflops"]
            c = e["cairn"]
            print(f"  cairn prefill {p}->{d}: {c['prefill']['tok_s']:.1f} tok/s, decode {c['decode']['tok_s']:.2f} tok/s"
                  + (f"; llama.cpp prefill {e['llama.cpp']['prefill']['tok_s']:.1f} tok/s "
                     f"({e['llama.cpp']['prefill']['tokens']} computed), decode "
                     f"{e['llama.cpp']['decode']['tok_s']:.2f} tok/s" if "llama.cpp" in e else ""), file=sys.stderr)
            res["depths"].append(e)
            base = base or e
            p = d
            if args.json:  # partial results survive an interrupted long run
                Path(args.json).write_text(json.dumps(res, indent=2, default=str))
    finally:
        if server is not None:
            os.kill(server.proc.pid, signal.SIGCONT)   # a stopped server would not see close()'s SIGTERM
            server.close()
    if args.project:
        slice_res = json.loads(Path(args.slice_json).read_text()) if args.slice_json else None
        res["projection"] = project(shape, res["depths"], slice_res)
    print_report(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
