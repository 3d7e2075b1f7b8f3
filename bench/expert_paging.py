"""Routed experts paged from disk against all resident, on a V4-Flash slice (issue 12, item 5).

    .venv/bin/cairn make-model --preset flash-slice --layers 2 /tmp/flash2
    .venv/bin/python bench/disk_probe.py --json /tmp/disk_probe.json
    .venv/bin/python bench/expert_paging.py /tmp/flash2 --probe /tmp/disk_probe.json \
        --json /tmp/expert_paging.json --plot docs/expert_paging_hit_rate.png

Each run is a fresh process (bench/paged_worker.py) that loads the model from the packed cache file
(written by the first run), prefills a token stream with chunk 128 and decodes greedily:

 * resident, and paged at each --shares of the routed experts' bytes (cold cache at the start);
 * on two streams: an agent session (the system prompt and turns of bench/agent_session.py,
   rendered as text and tokenized) and uniformly random token ids;
 * reported: prefill and decode tok/s, bytes read per token, the read bandwidth achieved (bytes read
   / prefill wall time: cold, prefill needs nearly every expert of every chunk) against the
   probe's, hit rate, and stalls (compute waiting for reads) as a share of prefill time.

Hit rate against budget: the route trace of a resident run that feeds the stream one token per
kernel call (as decode does) is replayed through the kernel's own policy code
(`_kernel.replay_expert_policy`) for LRU, LRFU, hotpin and the kernel's default, cycle, at 10..100 %
of the experts. Paged runs use the kernel's default policy (cycle; the results in docs/benchmarks/
dated before 2026-12-02 ran hotpin).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
WORKER = HERE / "paged_worker.py"


def agent_stream(model: Path, n: int) -> np.ndarray:
    """The agent session's text (bench/agent_session.py: the system prompt, then user turns and
    short assistant replies, re-rendered as clients do) as token ids, cut to n."""
    from agent_session import session_turns, system_prompt

    from cairn.daemon.weights.model_dir import open_model_dir
    from cairn.daemon.protocol.tokenizer import TextTokenizer

    tok = TextTokenizer.from_model_dir(open_model_dir(model))
    system = system_prompt(max(256, n // 2), tok)
    parts = [system]
    for conv, i in session_turns(system, 5):
        parts.append(f"Turn {i} of conversation {conv}: please fix test_{i}.py and explain the change in two sentences.")
        parts.append(f"I read test_{i}.py, fixed the failing assertion in module_{i}.py and ran the tests again.")
    ids = tok.encode("\n".join(parts))
    while len(ids) < n:
        ids = ids + ids
    return np.asarray(ids[:n], dtype=np.int32)


def code_stream(model: Path, n: int) -> np.ndarray:
    """Python source as an agent sends it: this repository's own daemon/ and actors/ modules (not in
    the default model's training corpus), as token ids, cut to n."""
    from cairn.daemon.weights.model_dir import open_model_dir
    from cairn.daemon.protocol.tokenizer import TextTokenizer

    tok = TextTokenizer.from_model_dir(open_model_dir(model))
    root = HERE.parent
    text = "\n\n".join(p.read_text() for d in ("daemon", "actors") for p in sorted((root / d).glob("*.py")))
    return np.asarray(tok.encode(text)[:n], dtype=np.int32)


def random_stream(vocab: int, n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(2, vocab, size=n).astype(np.int32)


def worker(model, packed, prompt, *extra) -> dict:
    cmd = [sys.executable, str(WORKER), str(model), str(packed), "--prompt-file", str(prompt), *map(str, extra)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=7200)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def summarize(r: dict, probe_gb_s: float | None) -> dict:
    pre, dec = r["prefill_stats"], r["decode_stats"]
    out = {"prefill_tok_s": r["prefill_tokens"] / r["prefill_s"], "decode_tok_s": r["decode_tokens"] / r["decode_s"],
           "vm_hwm_gb": r["vm_hwm"] / 1e9}
    if pre:
        look_p, look_d = pre["hits"] + pre["misses"], dec["hits"] + dec["misses"]
        bw = pre["bytes_read"] / r["prefill_s"] / 1e9
        out |= {
            "prefill_hit_rate": pre["hits"] / look_p if look_p else None,
            "decode_hit_rate": dec["hits"] / look_d if look_d else None,
            "prefill_gb_per_token": pre["bytes_read"] / r["prefill_tokens"] / 1e9,
            "decode_gb_per_token": dec["bytes_read"] / r["decode_tokens"] / 1e9,
            "prefill_read_gb_s": bw,
            "decode_read_gb_s": dec["bytes_read"] / r["decode_s"] / 1e9,
            "of_probe": bw / probe_gb_s if probe_gb_s else None,
            "stall_frac_prefill": pre["stall_seconds"] / r["prefill_s"],
            "read_s_prefill": pre["read_seconds"],
        }
    return out


def hit_curve(trace: np.ndarray, experts_per_layer: int, total_experts: int, shares, policies, kernel,
              k: int) -> dict:
    keys = trace[:, 1].astype(np.int64) * experts_per_layer + trace[:, 2]
    steps = trace[:, 0].astype(np.int64)
    curve = {}
    for pol in policies:
        rows = []
        for s in shares:
            slots = max(1, int(round(total_experts * s)))
            r = kernel.replay_expert_policy(keys, steps, slots, pol, k=k, n_layers=total_experts // experts_per_layer,
                                            num_experts=experts_per_layer)
            rows.append(r["hits"] / max(1, r["hits"] + r["misses"]))
        curve[pol] = rows
    return curve


def plot(curves: dict, shares, path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    styles = {"lru": ":", "lrfu": "--", "hotpin": "-.", "cycle": "-"}
    for stream, curve in curves.items():
        for pol, rows in curve.items():
            ax.plot([100 * s for s in shares], [100 * h for h in rows], styles.get(pol, "-"), marker="o",
                    markersize=3, label=f"{stream}, {pol.upper()}")
    ax.set_xlabel("expert cache budget (% of routed-expert bytes)")
    ax.set_ylabel("hit rate (%), one token per call")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.set_ylim(0, 100)
    ax.set_xlim(0, 100)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def paged_vs_resident(a, info: dict, f: Path, probe_bw, shares, runs: dict, name: str) -> None:
    """The stream resident, then paged at each share of the experts (a fresh process each)."""
    r = worker(a.model, a.packed, f, "--decode", a.decode, "--threads", a.threads)
    runs["resident"] = {**summarize(r, probe_bw), "digest": r["digest"]}
    print(f"{name:7s} resident   {runs['resident']}", flush=True)
    for s in shares:
        budget = int(info["expert_bytes_total"] * s)
        r = worker(a.model, a.packed, f, "--decode", a.decode, "--threads", a.threads, "--budget", budget)
        row = {**summarize(r, probe_bw), "budget_bytes": r["info"]["budget_bytes"], "slots": r["info"]["slots"],
               "identical": r["digest"] == runs["resident"]["digest"], "direct_io": r["info"]["direct_io"],
               "loadavg": open("/proc/loadavg").read().split()[:3]}
        runs[f"paged {int(100 * s)}%"] = row
        print(f"{name:7s} paged {int(100 * s):3d}% {row}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--packed", type=Path, default=Path("/tmp/cairn-paging-packed"))
    ap.add_argument("--probe", type=Path, default=None, help="bench/disk_probe.py --json output")
    ap.add_argument("--prompt", type=int, default=512, help="prefill tokens (chunk 128)")
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--trace-tokens", type=int, default=768, help="tokens fed one per call for the hit-rate curve")
    ap.add_argument("--shares", default="0.25,0.5")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--streams", default="agent,random", help="of agent, code (this repository's Python), random")
    ap.add_argument("--curves-only", action="store_true",
                    help="only the hit rate against budget (route trace + replay), no paged runs")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--plot", type=Path, default=None)
    a = ap.parse_args()

    from cairn import _kernel
    from cairn.daemon.weights.model_dir import open_model_dir

    md = open_model_dir(a.model)
    E = int(md.config["n_routed_experts"])
    tmp = Path(a.packed).parent / "cairn-paging-streams"
    tmp.mkdir(parents=True, exist_ok=True)
    probe = json.loads(a.probe.read_text()) if a.probe else {}
    probe_bw = probe.get("random_expert_gb_s")
    shares = [float(s) for s in a.shares.split(",")]
    res: dict = {"model": str(a.model), "loadavg_start": open("/proc/loadavg").read().split()[:3], "probe": probe,
                 "runs": {}, "curves": {}}
    t_all = time.time()
    streams = {}
    for name in a.streams.split(","):
        n = max(a.prompt, a.trace_tokens)
        ids = (agent_stream(a.model, n) if name == "agent" else code_stream(a.model, n) if name == "code"
               else random_stream(int(md.config["vocab_size"]), n))
        f = tmp / f"{name}.npy"
        np.save(f, ids[:a.prompt])
        ft = tmp / f"{name}-trace.npy"
        np.save(ft, ids[:a.trace_tokens])
        streams[name] = (f, ft)
    first = next(iter(streams.values()))[0]
    # the first start packs the model and writes the packed cache file (paging reads experts from it)
    t0 = time.time()
    info = worker(a.model, a.packed, first, "--decode", 1, "--threads", a.threads, "--budget", 1 << 50)["info"]
    res["pack_s"] = time.time() - t0
    res["info"] = info
    print(f"packed cache ready ({res['pack_s']:.0f} s); experts {info['expert_bytes_total'] / 1e9:.2f} GB "
          f"({info['experts_total']} x {info['slot_bytes'] / 2**20:.2f} MiB), dense {info['dense_bytes'] / 1e9:.2f} GB",
          flush=True)
    for name, (f, ft) in streams.items():
        runs = res["runs"].setdefault(name, {})
        if not a.curves_only:
            paged_vs_resident(a, info, f, probe_bw, shares, runs, name)
        # decode-like access: one token per kernel call, resident, route trace on
        trace_file = tmp / f"{name}-route.npy"
        worker(a.model, a.packed, ft, "--decode", 0, "--threads", a.threads, "--chunk", 1, "--trace", trace_file)
        trace = np.load(trace_file)
        curve_shares = [x / 10 for x in range(1, 11)]
        res["curves"][name] = hit_curve(trace, E, info["experts_total"], curve_shares, ("lru", "lrfu", "hotpin", "cycle"),
                                        _kernel, int(md.config["num_experts_per_tok"]))
        res["curve_shares"] = curve_shares
        print(f"{name:7s} hit rate vs budget {json.dumps(res['curves'][name])}", flush=True)
    res["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    res["seconds"] = time.time() - t_all
    if a.json:
        a.json.write_text(json.dumps(res, indent=2))
    if a.plot:
        plot(res["curves"], res["curve_shares"], a.plot,
             f"{a.model.name}: {info['experts_total']} routed experts, {a.trace_tokens} tokens one per call")


if __name__ == "__main__":
    main()
