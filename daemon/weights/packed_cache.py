"""Upkeep of the packed cache directory (`packed_cache_dir`, `packed_cache_budget_mb`).

Each packed file is about its model's size (~160 GB for V4-Flash), and a model whose fingerprint
changed, or that is no longer served, leaves its file behind. After a load, `trim_packed_cache`
removes the least recently used packed files (mtime: `load_model` touches the file it uses) while
the directory holds more than the budget. Never removed: the current file, and any file in use --
a kernel Model holds a shared flock on its file for as long as it lives (packed_file.cpp), so a
file another running daemon maps or pages from is skipped. Also removed: leftovers of crashed
packs (`<file>.tmp.<pid>` whose writer is dead and unlocked; `<file>.lock` nobody holds).
"""

from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path

_TMP = re.compile(r"\.pack\.tmp\.(\d+)$")


def _lock_if_unused(path: Path) -> int | None:
    """An fd holding an exclusive flock on path (nobody else holds it), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _remove_if_unused(path: Path, also=lambda: True) -> bool:
    fd = _lock_if_unused(path)
    if fd is None:
        return False
    try:
        if not also():
            return False
        os.unlink(path)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, another user's
        return True
    return True


def trim_packed_cache(cache_dir: str | Path, current: str | Path | None, budget_bytes: int) -> list[Path]:
    """Remove crashed packs' leftovers, then packed files other than `current` and those in use,
    least recently used first, until the directory's packed files fit in budget_bytes (0: only the
    current file and files in use stay). Returns what was removed; errors only skip a file."""
    cache_dir = Path(cache_dir)
    current = Path(current) if current else None
    removed: list[Path] = []
    try:
        entries = list(os.scandir(cache_dir))
    except OSError:
        return removed
    packs: list[tuple[float, int, Path]] = []
    total = 0
    for e in entries:
        path = Path(e.path)
        tmp = _TMP.search(e.name)
        if tmp:
            # a live writer holds the flock; its pid guards the instant between open and flock
            if _remove_if_unused(path, lambda: not _pid_alive(int(tmp.group(1)))):
                removed.append(path)
            continue
        if e.name.endswith(".pack.lock"):
            # the packer unlinks it when done, so one left over is a crashed packer's (a packer that
            # then locks this unlinked file sees that and takes a new one: packed_file.cpp)
            if _remove_if_unused(path):
                removed.append(path)
            continue
        if not e.name.endswith(".pack"):
            continue
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        total += st.st_size
        if current is None or path != current:
            packs.append((st.st_mtime, st.st_size, path))
    for _, size, path in sorted(packs):
        if total <= budget_bytes:
            break
        if _remove_if_unused(path):
            removed.append(path)
            total -= size
    return removed
