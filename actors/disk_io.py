"""The only file effects of prefix checkpoints: atomic write, load, scan, remove.

Blocking calls, meant for the checkpoint-writer actor to run in a worker thread, off the request
path. Errors are plain ``OSError`` (write side) or ``CheckpointFileError`` (read side) so the
caller can turn each into one warning and keep serving.

Design notes
 * A write goes to ``.<name>.<pid>-<rand>.tmp`` in the same directory (same file system, so the
   rename is atomic), is fsynced, renamed over ``<name>``, then the directory is fsynced so the
   rename itself survives a power cut. A crash at any point leaves either no ``<name>`` or the
   complete one, plus at worst a temp file; ``scan`` removes temp files and never loads them.
 * ``scan`` must not run while a writer is writing into the same directory (it would remove the
   writer's temp file): run it once at start-up before the writer starts.
 * Only files we own are touched: ``*.ckpt`` and our temp-file pattern. Anything else is left.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from .disk_format import SUFFIX, CheckpointFileError, Header, read_header, read_payload

TMP_SUFFIX = ".tmp"

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class Problem:
    """A file ``scan`` refused; ``removed`` is False when the unlink failed too."""

    path: Path
    reason: str
    removed: bool


def ensure_dir(path: str | os.PathLike) -> Path:
    """Create the checkpoint directory (mode 0700) if needed."""
    p = Path(path)
    p.mkdir(mode=0o700, parents=True, exist_ok=True)
    return p


def atomic_write(directory: str | os.PathLike, name: str, data: Buffer | Iterable[Buffer]) -> Path:
    """Write ``data`` (one buffer, or an iterable of buffers such as ``[header, payload]``) to
    ``directory/name`` atomically and durably. Raises ``OSError`` (read-only directory, full disk,
    file-size limit, …) after removing its temp file; an existing ``name`` is then untouched."""
    d = Path(directory)
    final = d / name
    tmp = d / f".{name}.{os.getpid()}-{secrets.token_hex(4)}{TMP_SUFFIX}"
    parts = [data] if isinstance(data, (bytes, bytearray, memoryview)) else data
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        try:
            for part in parts:
                view = memoryview(part).cast("B")
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(d)
    return final


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load(path: str | os.PathLike, fingerprint: str) -> tuple[Header, bytes]:
    """Header and verified payload of one file. Raises ``CheckpointFileError`` (bad file: the
    caller should ``remove`` it) or ``OSError`` (file gone, unreadable)."""
    with open(path, "rb") as f:
        header = read_header(f, fingerprint)
        return header, read_payload(f, header)


def remove(directory: str | os.PathLike, name: str) -> bool:
    """Delete ``directory/name`` if present; True when a file was removed."""
    try:
        os.unlink(Path(directory) / name)
        return True
    except FileNotFoundError:
        return False


def scan(directory: str | os.PathLike, fingerprint: str) -> tuple[list[tuple[Path, Header]], list[Problem]]:
    """Headers of the usable checkpoint files in ``directory`` (sorted by name) and the problems
    found. Temp files, and ``*.ckpt`` files that are truncated, corrupt, of another version or
    fingerprint, or misnamed, are removed and reported. A missing directory is empty."""
    d = Path(directory)
    good: list[tuple[Path, Header]] = []
    problems: list[Problem] = []
    try:
        names = sorted(os.listdir(d))
    except FileNotFoundError:
        return good, problems

    def reject(path: Path, reason: str) -> None:
        try:
            os.unlink(path)
            removed = True
        except FileNotFoundError:
            removed = True
        except OSError as e:
            removed = False
            reason = f"{reason}; not removed: {e.strerror or e}"
        problems.append(Problem(path, reason, removed))

    for name in names:
        path = d / name
        if name.startswith(".") and name.endswith(TMP_SUFFIX):
            reject(path, "leftover temp file (interrupted write)")
            continue
        if not name.endswith(SUFFIX) or not path.is_file():
            continue
        try:
            with open(path, "rb") as f:
                header = read_header(f, fingerprint)
                size = os.fstat(f.fileno()).st_size
        except CheckpointFileError as e:
            reject(path, e.reason)
            continue
        except OSError as e:
            problems.append(Problem(path, f"unreadable: {e.strerror or e}", False))
            continue
        if size < header.file_len:
            reject(path, "truncated")
        elif size > header.file_len:
            reject(path, "trailing bytes")
        elif header.name != name:
            reject(path, "file name does not match its token ids")
        else:
            good.append((path, header))
    return good, problems
