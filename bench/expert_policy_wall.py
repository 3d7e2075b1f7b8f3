"""Wall time of the same paged session under several expert policies, alternating run by run.

    .venv/bin/python bench/expert_policy_wall.py /work/bench-small --budget 0.25 --reps 4
    .venv/bin/python bench/expert_policy_wall.py models/cairn-code --text daemon --budget 0.25

bench/expert_policy.py counts hits; this shows what they cost in time. A policy that gives up a
call's held expert (cycle) makes the next read wait for that expert's compute, where hotpin's k
unpinned slots let a decode step's k reads overlap, so fewer misses need not mean less time. Each
policy gets its own model (its own slot pool, warm between reps); every run is a fresh State: a
prefill of --prompt tokens in --chunk chunks, then --decode greedy steps. Prints per policy the
per-run seconds (prefill, decode), stall seconds and hit rate, and the median decode seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from expert_policy import text_tokens

import cairn._kernel as K
from cairn.daemon.weights.model_dir import map_weights, open_model_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--policies", default="hotpin,cycle")
    ap.add_argument("--budget", type=float, default=0.25, help="fraction of the routed experts")
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--text", help="prompt tokens from this file or directory of .py files (default: random)")
    args = ap.parse_args()
    md = open_model_dir(args.model_dir)
    cfg = md.config
    prompt = (text_tokens(md, args.text, args.prompt) if args.text else
              np.random.default_rng(0).integers(0, cfg["vocab_size"], args.prompt).astype(np.int32))
    with tempfile.TemporaryDirectory() as tmp:
        packed = str(Path(tmp) / "packed.bin")
        info = K.Model(cfg, map_weights(md), md.fingerprint, args.threads, packed_cache=packed).expert_cache_info()
        slots = max(cfg["num_experts_per_tok"], int(args.budget * info["experts_total"]))
        models = {p: K.Model(cfg, map_weights(md), md.fingerprint, args.threads, packed_cache=packed,
                             expert_cache_bytes=slots * info["slot_bytes"], expert_policy=p)
                  for p in args.policies.split(",")}
        runs: dict[str, list] = {p: [] for p in models}
        for _ in range(args.reps):
            for p, m in models.items():
                before = m.expert_cache_stats()
                st = K.State(m)
                t = time.perf_counter()
                _, logits = K.prefill(st, prompt, chunk=args.chunk)
                t_prefill = time.perf_counter() - t
                tok = int(np.argmax(logits))
                t = time.perf_counter()
                for _ in range(args.decode):
                    tok = int(np.argmax(K.decode(st, tok)))
                t_decode = time.perf_counter() - t
                after = m.expert_cache_stats()
                d = {k: after[k] - before[k] for k in after}
                runs[p].append({"prefill_s": round(t_prefill, 3), "decode_s": round(t_decode, 3),
                                "stall_s": round(d["stall_seconds"], 3),
                                "hit": round(d["hits"] / max(1, d["hits"] + d["misses"]), 4)})
    print(json.dumps({"model": args.model_dir, "slots": slots, "slot_bytes": info["slot_bytes"],
                      "loadavg": open("/proc/loadavg").read().split()[:3],
                      "median_decode_s": {p: statistics.median(r["decode_s"] for r in v) for p, v in runs.items()},
                      "median_prefill_s": {p: statistics.median(r["prefill_s"] for r in v) for p, v in runs.items()},
                      "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
