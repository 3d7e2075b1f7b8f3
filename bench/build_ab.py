"""Two builds of the kernel side by side on one model: prefill and decode tok/s, alternating A, B, A, B.

    .venv/bin/python bench/build_ab.py MODEL --a /path/to/other/.venv/bin/python [--rounds 3] [--threads 1]

Each round runs a child per build (its own interpreter, so its own installed kernel): load, prefill
512 ids in chunks of 256, decode 48 tokens, three times, best of each. With --threads 1 the times are
the child's CPU time, which other work on the machine disturbs least; the ratio B/A is the result.
B is this interpreter's build unless --b names another.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, sys, time
import numpy as np
import cairn._kernel as K
from cairn.daemon.weights.model_dir import load_model
threads = int(sys.argv[2])
clock = time.process_time if threads == 1 else time.perf_counter
m = load_model(sys.argv[1], threads=threads)
ids = np.random.default_rng(0).integers(0, 512, 512).astype(np.int32)
best_p = best_d = 0.0
for _ in range(3):
    s = K.State(m)
    t = clock(); K.prefill(s, ids, chunk=256); tp = clock() - t
    t = clock()
    for i in range(48): K.decode(s, int(ids[i]))
    td = clock() - t
    best_p, best_d = max(best_p, 512 / tp), max(best_d, 48 / td)
print(json.dumps({"isa": getattr(K, "ISA", "native"), "prefill": best_p, "decode": best_d}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--a", required=True, help="python of the other build (A)")
    ap.add_argument("--b", default=sys.executable, help="python of this build (B); default: this interpreter")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    runs = {"A": [], "B": []}
    for _ in range(args.rounds):
        for side, py in (("A", args.a), ("B", args.b)):
            out = subprocess.run([py, "-c", CHILD, args.model, str(args.threads)], capture_output=True, text=True,
                                 check=True)
            runs[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(side, runs[side][-1], flush=True)
    best = {s: {k: max(r[k] for r in rs) for k in ("prefill", "decode")} for s, rs in runs.items()}
    for k in ("prefill", "decode"):
        print(f"{k}: A {best['A'][k]:.1f}  B {best['B'][k]:.1f} tok/s  B/A {best['B'][k] / best['A'][k]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
