"""Expert cache policies on real routing: record a model's route trace over an agent-like session
(a long system prompt, then turns of user tokens prefilled in chunks and a decoded reply), then
replay it through the kernel's own slot policy (replay_expert_policy) at several budgets.

    cairn make-model --preset small /tmp/small
    .venv/bin/python bench/expert_policy.py /tmp/small --threads 2

Prints hit rates of 'lru' and 'lrfu' side by side per budget (fraction of all routed experts).
The synthetic models' routers are random, so their routing is flatter than a trained model's;
the ratio, not the absolute rate, is what this measures.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

import cairn._kernel as K
from cairn.daemon.weights.model_dir import load_model, open_model_dir


def session_trace(model: K.Model, vocab: int, system: int, turns: int, user: int, reply: int,
                  chunk: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    model.set_route_trace(True)
    st = K.State(model)
    K.prefill(st, rng.integers(0, vocab, system).astype(np.int32), chunk=chunk)
    tok = 0
    for _ in range(turns):
        K.prefill(st, rng.integers(0, vocab, user).astype(np.int32), chunk=chunk)
        for _ in range(reply):
            tok = int(np.argmax(K.decode(st, tok)))
    model.set_route_trace(False)
    return model.take_route_trace()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--system", type=int, default=512)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--user", type=int, default=64)
    ap.add_argument("--reply", type=int, default=32)
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--budgets", default="0.1,0.25,0.5")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    md = open_model_dir(args.model_dir)
    cfg = md.config
    model = load_model(md, args.threads)
    trace = session_trace(model, cfg["vocab_size"], args.system, args.turns, args.user, args.reply, args.chunk,
                          args.seed)
    E, total = cfg["n_routed_experts"], cfg["n_routed_experts"] * cfg["num_hidden_layers"]
    keys = trace[:, 1].astype(np.int64) * E + trace[:, 2]
    steps = trace[:, 0].astype(np.int64)
    rows = []
    for frac in (float(f) for f in args.budgets.split(",")):
        slots = max(cfg["num_experts_per_tok"], int(frac * total))
        r = {p: K.replay_expert_policy(keys, steps, slots, p, k=cfg["num_experts_per_tok"]) for p in ("lru", "lrfu", "hotpin")}
        rate = {p: r[p]["hits"] / (r[p]["hits"] + r[p]["misses"]) for p in r}
        rows.append({"budget": frac, "slots": slots, "lru_hit": round(rate["lru"], 4),
                     "lrfu_hit": round(rate["lrfu"], 4), "hotpin_hit": round(rate["hotpin"], 4),
                     "miss_ratio_hotpin_vs_lru": round(r["hotpin"]["misses"] / max(1, r["lru"]["misses"]), 4)})
    print(json.dumps({"accesses": len(keys), "calls": int(steps.max() + 1) if len(steps) else 0,
                      "experts_total": total, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
