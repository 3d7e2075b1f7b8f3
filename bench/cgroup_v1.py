"""Run a command inside a fresh cgroup v1 memory group with a hard limit, and report what the
group saw: peak usage (memory.max_usage_in_bytes), how often the limit was hit (memory.failcnt)
and whether the OOM killer fired (memory.oom_control `oom_kill`). For bench (bench/cgroup_paging.py);
the tests use tests/memory_cap.py (v1 and v2, root or delegated). Needs root and a writable v1
memory hierarchy at /sys/fs/cgroup/memory; `CgroupUnavailable` says what is missing. The group is
ours alone (cairn-<name>-<pid>), the child joins it before exec, and it is removed afterwards.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup/memory")


class CgroupUnavailable(RuntimeError):
    pass


@dataclass(frozen=True)
class CgroupRun:
    returncode: int
    stdout: str
    stderr: str
    limit_bytes: int
    max_usage_bytes: int
    failcnt: int
    oom_kills: int
    under_oom: bool


def check_writable(root: Path = ROOT) -> None:
    if not (root / "memory.limit_in_bytes").exists():
        raise CgroupUnavailable(f"{root}: no cgroup v1 memory hierarchy mounted here (this test needs one: "
                                "mount -t cgroup -o memory cgroup /sys/fs/cgroup/memory)")
    if not os.access(root, os.W_OK):
        raise CgroupUnavailable(f"{root}: not writable (run as root to create a memory cgroup)")


def _oom(group: Path) -> tuple[int, bool]:
    kills, under = 0, False
    for line in (group / "memory.oom_control").read_text().splitlines():
        k, _, v = line.partition(" ")
        if k == "oom_kill":
            kills = int(v)
        elif k == "under_oom":
            under = v.strip() == "1"
    return kills, under


def run_limited(cmd: list[str], limit_bytes: int, *, name: str = "run", timeout: float = 600,
                env: dict | None = None, root: Path = ROOT) -> CgroupRun:
    check_writable(root)
    group = root / f"cairn-{name}-{os.getpid()}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(int(limit_bytes)))
        procs = str(group / "cgroup.procs")

        def join() -> None:          # in the child, before exec: every byte it maps is charged here
            with open(procs, "w") as fh:
                fh.write(str(os.getpid()))

        p = subprocess.run(cmd, preexec_fn=join, capture_output=True, text=True, timeout=timeout, env=env)
        kills, under = _oom(group)
        return CgroupRun(p.returncode, p.stdout, p.stderr, int((group / "memory.limit_in_bytes").read_text()),
                         int((group / "memory.max_usage_in_bytes").read_text()),
                         int((group / "memory.failcnt").read_text()), kills, under)
    finally:
        # The child has exited; its page cache charges move to the parent on rmdir.
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                import time
                time.sleep(0.1)
