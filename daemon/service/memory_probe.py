"""How much memory this process may use: MemAvailable and the memory limits of its own cgroups.

A service started by systemd with MemoryMax= (cgroup v2 `memory.max`) or a container with a v1
`memory.limit_in_bytes` can be OOM-killed long before the machine runs out. Every limited group from
ours up to the mount root is a candidate, as its limit minus what it already holds that cannot be
reclaimed (usage minus inactive file pages); the memory plan (memory_plan.pick_limit) takes the
smallest room among them and MemAvailable. Paths are parameters so tests feed fake /proc and /sys
trees; parsing is pure.
"""

from __future__ import annotations

from pathlib import Path

from .memory_plan import LimitSource, available_memory, pick_limit

UNLIMITED = 1 << 60          # v1 reports "no limit" as a page-rounded 2^63-1
V1 = "cgroup v1 memory.limit_in_bytes"
V2 = "cgroup v2 memory.max"


def own_cgroups(proc_cgroup: str) -> tuple[str | None, str | None]:
    """(v1 memory cgroup path, v2 unified path) from the text of /proc/self/cgroup."""
    v1 = v2 = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v1, v2


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return UNLIMITED
    try:
        return int(text)
    except ValueError:
        return None


def _stat(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == key:
                return int(v)
    except (OSError, ValueError):
        pass
    return 0


def _walk(root: Path, rel: str):
    """Our group first, then each parent up to the mount root (present directories only)."""
    parts = [p for p in rel.strip("/").split("/") if p]
    for i in range(len(parts), -1, -1):
        d = root.joinpath(*parts[:i])
        if d.is_dir():
            yield d


def cgroup_limits(proc_cgroup: str, sys_cgroup: str | Path = "/sys/fs/cgroup") -> list[LimitSource]:
    """Every memory limit of our cgroup and its ancestors, v1 and v2 (none: no limit)."""
    sys_cgroup = Path(sys_cgroup)
    v1, v2 = own_cgroups(proc_cgroup)
    candidates = []
    if v1 is not None:
        candidates.append((V1, sys_cgroup / "memory", v1, "memory.limit_in_bytes", "memory.usage_in_bytes",
                           "total_inactive_file"))
    if v2 is not None:
        # The unified hierarchy is mounted at /sys/fs/cgroup (pure v2) or /sys/fs/cgroup/unified (hybrid).
        for root in (sys_cgroup, sys_cgroup / "unified"):
            if (root / "cgroup.controllers").exists():
                candidates.append((V2, root, v2, "memory.max", "memory.current", "inactive_file"))
                break
    out: list[LimitSource] = []
    for kind, root, rel, limit_f, usage_f, inactive in candidates:
        for d in _walk(root, rel):
            limit = _read_int(d / limit_f)
            if limit is None or limit >= UNLIMITED:
                continue
            used = max(0, (_read_int(d / usage_f) or 0) - _stat(d / "memory.stat", inactive))
            out.append(LimitSource(kind, limit, used, "/" + str(d.relative_to(root)).strip(".")))
    return out


def memory_limits(proc: str | Path = "/proc", sys_cgroup: str | Path = "/sys/fs/cgroup") -> list[LimitSource]:
    """MemAvailable (when known) and every cgroup limit that applies to this process."""
    proc = Path(proc)
    out: list[LimitSource] = []
    try:
        avail = available_memory((proc / "meminfo").read_text())
    except OSError:
        avail = None
    if avail is not None:
        out.append(LimitSource("MemAvailable", avail))
    try:
        out += cgroup_limits((proc / "self" / "cgroup").read_text(), sys_cgroup)
    except OSError:
        pass
    return out


def binding_limit(proc: str | Path = "/proc", sys_cgroup: str | Path = "/sys/fs/cgroup") -> LimitSource | None:
    return pick_limit(memory_limits(proc, sys_cgroup))
