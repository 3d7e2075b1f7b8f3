"""The soak (bench/soak.py, issue 40 §8), short: 45 s of the same hostile load after a 30 s warm-up,
three conversation clients: no crash, no wedge, no answer changed against the quiet reference run, no
OOM kill, nothing unexpected. The fifth zero of the full soak (RSS back to its post-warm-up baseline
± 5 %) is printed, not asserted here: after 45 s the baseline has not settled (a plateau of 3–6 MB of
Python pools and bounded tables still filling; docs/benchmarks/soak.md), so it is judged by
`bench/soak.py` runs of minutes.

The daemon runs in a memory cgroup near the plan's limit where the host has one (tests/memory_cap.py);
where it has none the soak still runs, uncapped, and reports "no cgroup" for the OOM count. Never
skipped. About 105 s on two cores (reference run, warm-up, load, two idle readings).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_a_short_soak_ends_with_five_zeros(tmp_path):
    out = tmp_path / "soak.json"
    argv = [sys.executable, str(BENCH / "soak.py"), "--minutes", "0.75", "--warmup", "30", "--clients", "3",
            "--conversations", "8", "--seed", "40", "--request-timeout", "60", "--workdir", str(tmp_path / "work"),
            "--json", str(out)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert out.exists(), f"soak exited {r.returncode} with no summary: {r.stderr[-3000:]}"
    s = json.loads(out.read_text())
    logs = f"failures: {s['failures']}; daemon log: {tmp_path / 'work' / 'soak.log'}"
    print(f"soak: leaked_bytes {s['leaked_bytes']} (not asserted in the short run)")
    assert (s["crashes"], s["wedges"], s["answers_changed"], s["unexpected"]) == (0, 0, 0, 0), logs
    assert s["oom_kills"] == ("no cgroup" if "none" in s["cgroup"] else 0), logs   # "no cgroup": the host has none
    assert not s["failures"], logs
    # the load happened: answers checked, resumes after disconnects, refusals of bad and large bodies
    served = s["served"]
    assert served["answers"] >= 20 and served["status_polls"] >= 200, served
    assert s["retries"] >= 2 and s["disconnects"]["prefill"] + s["disconnects"]["decode"] == s["retries"], s
    assert served["bad_bodies_refused"] >= 10 and served["large_bodies_refused"] >= 3, served
    # turns padded to just under the plan's body limit are served, not refused (~5 % of the turns)
    assert served["padded_bodies"] >= 1 and 0 < s["plan"]["body_bytes"] <= 64 << 20, (served, s["plan"])
