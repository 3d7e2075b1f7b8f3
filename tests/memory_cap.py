"""Run processes under a hard memory limit, for tests: `with memory_cap(limit) as cap: cap.popen(argv)`.

A fresh cgroup of our own holds the limit; `cap.oom_kills()` and `cap.peak_bytes()` tell what the group
saw, and the group is removed afterwards. Backends, the first usable wins:
 * `CAIRN_TEST_CGROUP=/sys/fs/cgroup/...`: a parent directory delegated to us (v2 when it has
   cgroup.controllers, else v1 memory);
 * cgroup v1: the memory hierarchy at /sys/fs/cgroup/memory, writable (root);
 * cgroup v2: a writable parent of our own cgroup with the memory controller enabled for children.
With none, `CgroupUnavailable` says what is missing: a test that needs a cap fails, never skips.
(A minimal local version; the shared helper of the same name and API replaces it when merged.)
"""

from __future__ import annotations

import os
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

V1_ROOT = Path("/sys/fs/cgroup/memory")
V2_ROOT = Path("/sys/fs/cgroup")


class CgroupUnavailable(RuntimeError):
    pass


def _kv(path: Path) -> dict[str, int]:
    out = {}
    for line in path.read_text().splitlines():
        k, _, v = line.partition(" ")
        try:
            out[k] = int(v)
        except ValueError:
            pass
    return out


class Cap:
    def __init__(self, group: Path, version: int, limit: int) -> None:
        self.group, self.version, self.limit = group, version, limit
        self.procs: list[subprocess.Popen] = []

    def _join(self) -> None:          # in the child, before exec: every byte it maps is charged here
        with open(self.group / "cgroup.procs", "w") as fh:
            fh.write(str(os.getpid()))

    def popen(self, argv, **kw) -> subprocess.Popen:
        p = subprocess.Popen(argv, preexec_fn=self._join, **kw)
        self.procs.append(p)
        return p

    def oom_kills(self) -> int:
        if self.version == 1:
            return _kv(self.group / "memory.oom_control").get("oom_kill", 0)
        return _kv(self.group / "memory.events").get("oom_kill", 0)

    def peak_bytes(self) -> int:
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        try:
            return int((self.group / name).read_text())
        except (OSError, ValueError):   # v2 before 5.19 has no memory.peak
            return int((self.group / "memory.current").read_text())


def _v2_parent() -> Path | None:
    try:
        rel = next(line[3:] for line in Path("/proc/self/cgroup").read_text().splitlines() if line.startswith("0::"))
    except (OSError, StopIteration):
        return None
    here = V2_ROOT / rel.strip("/")
    for d in (here, here.parent):
        ctl = d / "cgroup.subtree_control"
        if ctl.exists() and os.access(d, os.W_OK) and "memory" in ctl.read_text().split():
            return d
    return None


def _backend() -> tuple[Path, int]:
    env = os.environ.get("CAIRN_TEST_CGROUP")
    if env:
        d = Path(env)
        if not d.is_dir() or not os.access(d, os.W_OK):
            raise CgroupUnavailable(f"CAIRN_TEST_CGROUP={env}: not a writable cgroup directory")
        return d, 2 if (d / "cgroup.controllers").exists() else 1
    if (V1_ROOT / "memory.limit_in_bytes").exists() and os.access(V1_ROOT, os.W_OK):
        return V1_ROOT, 1
    d = _v2_parent()
    if d is not None:
        return d, 2
    raise CgroupUnavailable(
        "no memory cgroup to cap a test process: need root with cgroup v1 at /sys/fs/cgroup/memory, a writable "
        "cgroup v2 parent with the memory controller delegated, or CAIRN_TEST_CGROUP=<a delegated directory>")


@contextmanager
def memory_cap(limit_bytes: int, name: str = "test"):
    parent, version = _backend()
    group = parent / f"cairn-{name}-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    group.mkdir()
    cap = Cap(group, version, int(limit_bytes))
    try:
        if version == 1:
            (group / "memory.limit_in_bytes").write_text(str(int(limit_bytes)))
        else:
            (group / "memory.max").write_text(str(int(limit_bytes)))
            (group / "memory.swap.max").exists() and (group / "memory.swap.max").write_text("0")
        yield cap
    finally:
        for p in cap.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for _ in range(50):       # the page cache charges move to the parent on rmdir
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
