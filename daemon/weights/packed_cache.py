"""Upkeep of the packed cache directory (`packed_cache_dir`, `packed_cache_budget_mb`).

Each packed file is about its model's size (~160 GB for V4-Flash). A file is named
`<source key>-<fingerprint>.pack`, the source key a hash of the model directory's path, so a model
keeps one current file: after a load, `trim_packed_cache` removes this model's files of older
fingerprints (its weights changed) and files of an older naming (an earlier cairn's, never mapped
again), then, while the directory holds more than the budget (0: no cap), other models' files, least
recently used first (mtime: `load_model` touches the file it uses). Never removed: the current file,
and any file in use -- a kernel Model holds a shared flock on its file for as long as it lives
(packed_file.cpp), so a file another running daemon maps or pages from is skipped. Also removed:
leftovers of crashed packs (`<file>.tmp.<pid>` whose writer is dead and unlocked; `<file>.lock`
nobody holds).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
from pathlib import Path

_TMP = re.compile(r"\.pack\.tmp\.(\d+)$")
_OLD_NAMING = re.compile(r"^[0-9a-f]{32}(-widened)?\.pack$")   # before files carried their source key


def source_key(model_dir: str | Path) -> str:
    """8 hex digits naming a model directory (its resolved path) in packed file names."""
    return hashlib.blake2b(str(Path(model_dir).resolve()).encode(), digest_size=4).hexdigest()


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
    """Remove crashed packs' leftovers, this model's older files (same source key as `current`) and
    files of the older naming, then other models' files, least recently used first, while the
    directory's packed files hold more than budget_bytes (0: no cap). `current` and files in use are
    never removed. Returns what was removed; errors only skip a file."""
    cache_dir = Path(cache_dir)
    current = Path(current) if current else None
    mine = current.name.split("-", 1)[0] + "-" if current is not None else None
    removed: list[Path] = []
    try:
        entries = list(os.scandir(cache_dir))
    except OSError:
        return removed
    others: list[tuple[float, int, Path]] = []
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
        if not e.name.endswith(".pack") or path == current:
            if path == current:
                total += _size(e)
            continue
        stale = _OLD_NAMING.match(e.name) or (mine is not None and e.name.startswith(mine))
        if stale and _remove_if_unused(path):
            removed.append(path)
            continue
        size = _size(e)
        total += size
        try:
            others.append((e.stat(follow_symlinks=False).st_mtime, size, path))
        except OSError:
            continue
    for _, size, path in sorted(others):
        if budget_bytes <= 0 or total <= budget_bytes:
            break
        if _remove_if_unused(path):
            removed.append(path)
            total -= size
    return removed


def _size(e: os.DirEntry) -> int:
    try:
        return e.stat(follow_symlinks=False).st_size
    except OSError:
        return 0
