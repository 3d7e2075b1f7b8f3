"""Expert cache policies on real routing: record a model's route trace over an agent-like session
(a long system prompt, then turns of user tokens prefilled in chunks and a decoded reply), then
replay it through the kernel's own slot policy (replay_expert_policy) at several budgets.

    cairn make-model --preset small /tmp/small
    .venv/bin/python bench/expert_policy.py /tmp/small --threads 2
    .venv/bin/python bench/expert_policy.py models/cairn-code --text daemon   # a trained router on Python

Prints hit rates of 'lru', 'lrfu', 'hotpin' and 'cycle' per budget (fraction of all routed experts), beside
Belady's MIN on the same slots (bench/expert_min.py: the offline optimum, 'min_hit'; 'min_call_hit'
is MIN holding every call's experts to the call's end, the discipline lru and lrfu keep) and each
policy's hits as a share of MIN's ('<policy>_of_min'). The synthetic models' routers are random, so
their routing is flatter than a trained model's; --text feeds the session real tokens (the model's
tokenizer over a file, or a directory's .py files) instead of random ones.
"""

from __future__ import annotations

import argparse
import json

from pathlib import Path

import numpy as np
from expert_min import min_hits

import cairn._kernel as K
from cairn.daemon.weights.model_dir import load_model, open_model_dir

POLICIES = ("lru", "lrfu", "hotpin", "cycle")


def text_tokens(md, path: str, need: int) -> np.ndarray:
    """The model's tokens for a file, or a directory's .py files in sorted order (at least `need`)."""
    from tokenizers import Tokenizer

    p = Path(path)
    files = sorted(p.rglob("*.py")) if p.is_dir() else [p]
    if not files:
        raise SystemExit(f"--text {path}: no .py files there")
    tok = Tokenizer.from_str(md.tokenizer_text())
    ids: list[int] = []
    for f in files:
        ids += tok.encode(f.read_text(errors="replace")).ids
        if len(ids) >= need:
            break
    if len(ids) < need:
        raise SystemExit(f"--text {path}: {len(ids)} tokens, the session needs {need}")
    return np.asarray(ids[:need], np.int32)


def session_trace(model: K.Model, vocab: int, system: int, turns: int, user: int, reply: int,
                  chunk: int, seed: int, text: np.ndarray | None = None) -> np.ndarray:
    rng = np.random.default_rng(seed)
    feed = iter(np.split(text, np.cumsum([system] + [user] * (turns - 1)))) if text is not None else None

    def tokens(n: int) -> np.ndarray:
        return next(feed) if feed is not None else rng.integers(0, vocab, n).astype(np.int32)

    model.set_route_trace(True)
    st = K.State(model)
    K.prefill(st, tokens(system), chunk=chunk)
    tok = 0
    for _ in range(turns):
        K.prefill(st, tokens(user), chunk=chunk)
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
    ap.add_argument("--text", help="prompt tokens from this file (or directory of .py files) instead of random")
    ap.add_argument("--save-trace", help="also write the route trace here (.npz: trace, E, layers, k)")
    args = ap.parse_args()
    md = open_model_dir(args.model_dir)
    cfg = md.config
    model = load_model(md, args.threads)
    text = text_tokens(md, args.text, args.system + args.turns * args.user) if args.text else None
    trace = session_trace(model, cfg["vocab_size"], args.system, args.turns, args.user, args.reply, args.chunk,
                          args.seed, text)
    E, total = cfg["n_routed_experts"], cfg["n_routed_experts"] * cfg["num_hidden_layers"]
    if args.save_trace:
        np.savez(args.save_trace, trace=trace, E=E, layers=cfg["num_hidden_layers"], k=cfg["num_experts_per_tok"])
    keys = trace[:, 1].astype(np.int64) * E + trace[:, 2]
    steps = trace[:, 0].astype(np.int64)
    rows = []
    for frac in (float(f) for f in args.budgets.split(",")):
        slots = max(cfg["num_experts_per_tok"], int(frac * total))
        r = {p: K.replay_expert_policy(keys, steps, slots, p, k=cfg["num_experts_per_tok"],
                                       n_layers=cfg["num_hidden_layers"], num_experts=E) for p in POLICIES}
        r["min"] = min_hits(keys, steps, slots)
        r["min_call"] = min_hits(keys, steps, slots, hold="call")
        rate = {p: r[p]["hits"] / max(1, r[p]["hits"] + r[p]["misses"]) for p in r}
        row = {"budget": frac, "slots": slots, **{f"{p}_hit": round(rate[p], 4) for p in r}}
        row.update({f"{p}_of_min": round(r[p]["hits"] / max(1, r["min"]["hits"]), 4) for p in POLICIES})
        row["miss_ratio_hotpin_vs_lru"] = round(r["hotpin"]["misses"] / max(1, r["lru"]["misses"]), 4)
        row["miss_ratio_cycle_vs_hotpin"] = round(r["cycle"]["misses"] / max(1, r["hotpin"]["misses"]), 4)
        rows.append(row)
    print(json.dumps({"accesses": len(keys), "calls": int(steps.max() + 1) if len(steps) else 0,
                      "experts_total": total, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
