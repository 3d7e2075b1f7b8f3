"""How busy the machine is with work other than the benchmark's own, from /proc, to the jiffy.

A timed section that must run on a quiet machine waits for `wait_quiet` first and reports `OtherCpu`'s
figure over the section beside its result. The load average answers this a minute late and counts the
benchmark's own processes (llama-server, say, idling on its poll loop); this counts the cores that
every process except `own` pids used, over the last few seconds.
"""

from __future__ import annotations

import os
import time

_HZ = os.sysconf("SC_CLK_TCK")


def _busy_jiffies() -> int:
    """Every CPU's non-idle jiffies (user nice system irq softirq steal; iowait counts as idle)."""
    f = open("/proc/stat").readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in f[:8])
    return user + nice + system + irq + softirq + steal


def _pid_jiffies(pid: int) -> int:
    """A process's user + system jiffies, its threads and reaped children included."""
    try:
        raw = open(f"/proc/{pid}/stat").read()
    except OSError:
        return 0
    f = raw[raw.rindex(")") + 2:].split()   # fields after the command, which may hold spaces
    return sum(int(x) for x in f[11:15])     # utime stime cutime cstime


class OtherCpu:
    """Cores used by processes other than `own` (pids) since the last `start` / `cores` call."""

    def __init__(self, own: list[int]):
        self.own = own
        self.start()

    def _sample(self) -> tuple[float, int]:
        return time.monotonic(), _busy_jiffies() - sum(_pid_jiffies(p) for p in self.own)

    def start(self) -> None:
        self._t, self._j = self._sample()

    def cores(self) -> float:
        t, j = self._sample()
        c = max(0, j - self._j) / _HZ / max(t - self._t, 1e-3)
        self._t, self._j = t, j
        return c


def wait_quiet(own: list[int], below: float, hold_s: float = 5.0, budget_s: float = 3600.0) -> float:
    """Block until the other processes use fewer than `below` cores for `hold_s` seconds in a row
    (sampled each second), at most `budget_s`. Returns the seconds waited."""
    t0 = time.monotonic()
    meter, quiet_since = OtherCpu(own), time.monotonic()
    while time.monotonic() - t0 < budget_s:
        time.sleep(1.0)
        if meter.cores() >= below:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= hold_s:
            break
    return time.monotonic() - t0
