"""How much memory this process may use: MemAvailable and the memory limit of its own cgroup.

A service started by systemd with MemoryMax= (cgroup v2 `memory.max`) or a container with a v1
`memory.limit_in_bytes` can be OOM-killed long before the machine runs out: the room is the
smaller of the two. Within a cgroup the room is its limit minus what it already holds that cannot
be reclaimed (usage minus inactive file pages), taken at the tightest group from ours up to the
root. Paths are parameters so tests feed fake /proc and /sys trees; parsing is pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .slot_budget import available_memory

UNLIMITED = 1 << 60          # v1 reports "no limit" as a page-rounded 2^63-1


@dataclass(frozen=True, slots=True)
class CgroupRoom:
    version: int             # 1 or 2
    path: str                # the cgroup whose limit binds
    limit: int
    usage: int               # unreclaimable: usage - inactive file pages

    @property
    def room(self) -> int:
        return max(0, self.limit - self.usage)


@dataclass(frozen=True, slots=True)
class MemoryRoom:
    mem_available: int | None
    cgroup: CgroupRoom | None

    @property
    def bytes(self) -> int | None:
        vals = [v for v in (self.mem_available, self.cgroup.room if self.cgroup else None) if v is not None]
        return min(vals) if vals else None

    @property
    def source(self) -> str:
        if self.cgroup is not None and (self.mem_available is None or self.cgroup.room < self.mem_available):
            return f"cgroup v{self.cgroup.version} {self.cgroup.path} room (limit - usage)"
        return "MemAvailable"


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


def cgroup_room(proc_cgroup: str, sys_cgroup: str | Path = "/sys/fs/cgroup") -> CgroupRoom | None:
    """The binding (smallest room) memory limit of our cgroup and its ancestors, v1 or v2; None: no limit."""
    sys_cgroup = Path(sys_cgroup)
    v1, v2 = own_cgroups(proc_cgroup)
    best: CgroupRoom | None = None
    candidates = []
    if v1 is not None:
        candidates.append((1, sys_cgroup / "memory", v1, "memory.limit_in_bytes", "memory.usage_in_bytes",
                           "total_inactive_file"))
    if v2 is not None:
        # The unified hierarchy is mounted at /sys/fs/cgroup (pure v2) or /sys/fs/cgroup/unified (hybrid).
        for root in (sys_cgroup, sys_cgroup / "unified"):
            if (root / "cgroup.controllers").exists():
                candidates.append((2, root, v2, "memory.max", "memory.current", "inactive_file"))
                break
    for version, root, rel, limit_f, usage_f, inactive in candidates:
        for d in _walk(root, rel):
            limit = _read_int(d / limit_f)
            if limit is None or limit >= UNLIMITED:
                continue
            usage = max(0, (_read_int(d / usage_f) or 0) - _stat(d / "memory.stat", inactive))
            room = CgroupRoom(version, "/" + str(d.relative_to(root)).strip("."), limit, usage)
            if best is None or room.room < best.room:
                best = room
    return best


def memory_room(proc: str | Path = "/proc", sys_cgroup: str | Path = "/sys/fs/cgroup") -> MemoryRoom:
    proc = Path(proc)
    try:
        avail = available_memory((proc / "meminfo").read_text())
    except OSError:
        avail = None
    try:
        cg = cgroup_room((proc / "self" / "cgroup").read_text(), sys_cgroup)
    except OSError:
        cg = None
    return MemoryRoom(avail, cg)
