"""The budget under a hard memory cap: a paged run of a flash slice inside a cgroup v1 memory group
capped below the model's size, against the fully resident run outside it (issue 12, item 5).

    sudo .venv/bin/python bench/cgroup_paging.py /tmp/flash2 --packed /tmp/cairn-paging-packed/p \
        --share 0.25 --cap-gb 6 --json /tmp/cgroup_paging.json

Records the group's peak usage (memory.max_usage_in_bytes), how often it hit the cap (failcnt),
OOM kills (memory.oom_control), and whether the paged logits (prefill and every decode step,
digested) are bit-identical to the resident run's. The group is created and removed here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cgroup_v1  # noqa: E402
from expert_paging import WORKER, agent_stream, worker  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--packed", type=Path, required=True, help="the packed cache directory (written if missing)")
    ap.add_argument("--share", type=float, default=0.25, help="expert cache budget, share of the experts")
    ap.add_argument("--cap-gb", type=float, required=True, help="the cgroup's memory.limit_in_bytes (GB)")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()

    prompt = a.packed.parent / "cgroup-prompt.npy"
    np.save(prompt, agent_stream(a.model, a.prompt))
    common = ["--decode", a.decode, "--threads", a.threads]
    resident = worker(a.model, a.packed, prompt, *common)
    info = worker(a.model, a.packed, prompt, "--decode", 0, "--budget", 1 << 50)["info"]
    budget = int(info["expert_bytes_total"] * a.share)
    cap = int(a.cap_gb * 1e9)
    need = info["dense_bytes"] + budget
    model_bytes = info["dense_bytes"] + info["expert_bytes_total"]
    print(f"model {model_bytes / 1e9:.2f} GB packed (dense {info['dense_bytes'] / 1e9:.2f} + experts "
          f"{info['expert_bytes_total'] / 1e9:.2f}); budget {budget / 1e9:.2f} GB; cap {cap / 1e9:.2f} GB", flush=True)
    if not need < cap < model_bytes:
        raise SystemExit(f"the cap must lie between dense + budget ({need / 1e9:.2f} GB) and the model "
                         f"({model_bytes / 1e9:.2f} GB)")
    cmd = [sys.executable, str(WORKER), str(a.model), str(a.packed), "--prompt-file", str(prompt),
           *map(str, common), "--budget", str(budget)]
    run = cgroup_v1.run_limited(cmd, cap, name="paging-bench", timeout=7200)
    out = json.loads(run.stdout.strip().splitlines()[-1]) if run.returncode == 0 else {}
    res = {
        "cap_bytes": run.limit_bytes, "max_usage_bytes": run.max_usage_bytes, "failcnt": run.failcnt,
        "oom_kills": run.oom_kills, "returncode": run.returncode,
        "identical": out.get("digest") == resident["digest"], "paged_vm_hwm": out.get("vm_hwm"),
        "resident_vm_hwm": resident["vm_hwm"], "budget_bytes": budget, "dense_bytes": info["dense_bytes"],
        "expert_bytes_total": info["expert_bytes_total"], "state_bytes": out.get("state_bytes"),
        "paged_prefill_tok_s": a.prompt / out["prefill_s"] if out else None,
        "paged_decode_tok_s": a.decode / out["decode_s"] if out else None,
        "resident_prefill_tok_s": a.prompt / resident["prefill_s"], "resident_decode_tok_s": a.decode / resident["decode_s"],
        "loadavg": open("/proc/loadavg").read().split()[:3],
        "stderr_tail": run.stderr[-1500:] if run.returncode else "",
    }
    print(json.dumps(res, indent=2))
    if a.json:
        a.json.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
