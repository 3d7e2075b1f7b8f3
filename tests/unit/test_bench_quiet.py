"""bench/quiet.py: the cores other processes use, to the jiffy, without the benchmark's own.

A busy child process is counted while it is someone else's and not when its pid is the benchmark's;
`wait_quiet` returns at once on a quiet machine and waits out a busy one until its budget.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import quiet  # noqa: E402

SPIN = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 30: pass"


def test_a_busy_process_counts_unless_it_is_the_benchmarks_own():
    child = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        time.sleep(0.3)
        every, but_child = quiet.OtherCpu([]), quiet.OtherCpu([child.pid])   # over the same second
        c0 = quiet._pid_jiffies(child.pid)
        time.sleep(1.0)
        c1 = quiet._pid_jiffies(child.pid)
        a, b = every.cores(), but_child.cores()
        waited = quiet.wait_quiet([], below=0.5, hold_s=1.0, budget_s=1.5)
    finally:
        child.kill()
        child.wait()
    child_cores = (c1 - c0) / quiet._HZ
    assert child_cores > 0.2, child_cores          # it spun
    assert a >= child_cores - 0.05, (a, child_cores)
    assert abs((a - b) - child_cores) < 0.1, (a, b, child_cores)   # own pids are left out, to the jiffy
    assert waited >= 1.5                           # never quiet: waited out its budget


def test_wait_quiet_returns_once_the_others_are_quiet_for_the_hold():
    cores = os.cpu_count() or 1
    waited = quiet.wait_quiet([], below=cores + 1, hold_s=1.0, budget_s=60)   # more cores than the machine has
    assert 1.0 <= waited < 60                  # returned after its hold, not after the budget
