"""One measured process for the paged-expert test and bench: load a model (paged or resident, from a
packed cache written beforehand), greedily prefill + decode a fixed token stream, print one JSON
line: the tokens, a digest of every logits row, the expert cache's info and counters, timings and
the process's peak RSS (VmHWM). `--nothing` imports the same modules and loads nothing: the
baseline a budget check adds the model's parts to.

    python bench/paged_worker.py MODEL_DIR PACKED_DIR --budget BYTES --prompt-file ids.npy --decode 8
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time


def vm_hwm(pid: int | str = "self") -> int:
    """Peak resident bytes of a process (this one by default)."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("packed")
    ap.add_argument("--budget", type=int, default=0, help="expert_cache_bytes (0: every expert resident)")
    ap.add_argument("--policy", default=None)
    ap.add_argument("--readers", type=int, default=None, help="expert_readers (the kernel's default when omitted)")
    ap.add_argument("--prefetch", choices=("on", "off"), default=None,
                    help="expert_prefetch (the kernel's default when omitted; a kernel without it ignores it)")
    ap.add_argument("--prompt-file", default=None, help=".npy int32 token ids")
    ap.add_argument("--decode", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--trace", default=None, help="write the route trace ([n,3] int32 .npy) here")
    ap.add_argument("--nothing", action="store_true")
    ap.add_argument("--warm", type=int, default=0, help="prefill this many tokens first, untimed (a warm cache)")
    a = ap.parse_args()

    import numpy as np

    from cairn import _kernel
    from cairn.daemon.weights.model_dir import open_model_dir

    md = open_model_dir(a.model)
    if a.nothing:
        print(json.dumps({"vm_hwm": vm_hwm()}))
        return
    # As load_model does, with the policy knob it does not have: the packed cache file is required
    # for paging (and written by the first run).
    from pathlib import Path

    from cairn.daemon.weights.model_dir import map_weights, packed_cache_file

    Path(a.packed).mkdir(parents=True, exist_ok=True)
    kw = {"expert_cache_bytes": a.budget}
    if a.policy:
        kw["expert_policy"] = a.policy
    if a.readers is not None:
        kw["expert_readers"] = a.readers
    t0 = time.perf_counter()
    model = _kernel.Model(md.config, map_weights(md), md.fingerprint, a.threads,
                          packed_cache=str(packed_cache_file(md, a.packed)), **kw)
    load_s = time.perf_counter() - t0
    if a.prefetch and a.budget and hasattr(model, "expert_prefetch"):
        model.expert_prefetch = a.prefetch == "on"
    ids = np.load(a.prompt_file).astype(np.int32)
    if a.trace and hasattr(model, "set_route_trace"):
        model.set_route_trace(True)
    st = _kernel.State(model)
    digest = hashlib.sha256()
    if a.warm:             # the cache as a conversation's earlier turns left it; the rest is measured
        _kernel.prefill(st, ids[:a.warm], chunk=a.chunk)
        ids = ids[a.warm:]
    stats0 = model.expert_cache_stats() if hasattr(model, "expert_cache_stats") else {}
    t0 = time.perf_counter()
    _, logits = _kernel.prefill(st, ids, chunk=a.chunk)
    prefill_s = time.perf_counter() - t0
    stats1 = model.expert_cache_stats() if stats0 else {}
    digest.update(np.asarray(logits, np.float32).tobytes())
    out = []
    t0 = time.perf_counter()
    for _ in range(a.decode):
        tok = int(np.argmax(logits))
        out.append(tok)
        logits = _kernel.decode(st, tok)
        digest.update(np.asarray(logits, np.float32).tobytes())
    decode_s = time.perf_counter() - t0
    stats2 = model.expert_cache_stats() if stats0 else {}
    if a.trace and hasattr(model, "take_route_trace"):
        np.save(a.trace, np.asarray(model.take_route_trace(), dtype=np.int32))
    info = model.expert_cache_info() if hasattr(model, "expert_cache_info") else {}

    def delta(x, y):
        return {k: y[k] - x[k] for k in y} if x else {}

    print(json.dumps({
        "tokens": out, "digest": digest.hexdigest(), "vm_hwm": vm_hwm(), "load_s": load_s,
        "prefill_tokens": int(len(ids)), "prefill_s": prefill_s, "decode_tokens": a.decode, "decode_s": decode_s,
        "prefill_stats": delta(stats0, stats1), "decode_stats": delta(stats1, stats2),
        "info": {k: (v if isinstance(v, (bool, str)) else int(v)) for k, v in dict(info).items()},
        "state_bytes": int(st.nbytes),
    }))


if __name__ == "__main__":
    main()
