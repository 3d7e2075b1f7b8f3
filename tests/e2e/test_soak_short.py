"""The soak (bench/soak.py, issue 40 §8), short: 45 s of the same hostile load after a 15 s warm-up,
three conversation clients, and the same five zeros — no crash, no wedge, no answer changed against
the quiet reference run, no OOM kill, no RSS growth past 5 % of the post-warm-up baseline.

The daemon runs in a memory cgroup near the plan's limit where the host has one (tests/memory_cap.py);
where it has none the soak still runs, uncapped, and reports "no cgroup" for the OOM count. Never
skipped. About 90 s on two cores (reference run, warm-up, load, two idle readings).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_a_short_soak_ends_with_five_zeros(tmp_path):
    out = tmp_path / "soak.json"
    argv = [sys.executable, str(BENCH / "soak.py"), "--minutes", "0.75", "--warmup", "15", "--clients", "3",
            "--conversations", "8", "--seed", "40", "--request-timeout", "60", "--workdir", str(tmp_path / "work"),
            "--json", str(out)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert out.exists(), f"soak exited {r.returncode} with no summary: {r.stderr[-3000:]}"
    s = json.loads(out.read_text())
    logs = f"failures: {s['failures']}; daemon log: {tmp_path / 'work' / 'soak.log'}"
    assert (s["crashes"], s["wedges"], s["answers_changed"], s["leaked_bytes"], s["unexpected"]) == (0, 0, 0, 0, 0), logs
    assert s["oom_kills"] == ("no cgroup" if "none" in s["cgroup"] else 0), logs   # "no cgroup": the host has none
    assert r.returncode == 0 and s["ok"], logs
    # the load happened: answers checked, resumes after disconnects, refusals of bad and large bodies
    served = s["served"]
    assert served["answers"] >= 20 and served["status_polls"] >= 200, served
    assert s["retries"] >= 2 and s["disconnects"]["prefill"] + s["disconnects"]["decode"] == s["retries"], s
    assert served["bad_bodies_refused"] >= 10 and served["large_bodies_refused"] >= 3, served
    # turns padded to just under the plan's body limit are served, not refused (~5 % of the turns)
    assert served["padded_bodies"] >= 1 and 0 < s["plan"]["body_bytes"] <= 64 << 20, (served, s["plan"])
