"""The only file effects of prefix checkpoints: model directory + lock, atomic write, load, scan, remove.

Blocking calls, meant for the checkpoint-writer actor to run in a worker thread, off the request
path. Errors are plain ``OSError`` (write side) or ``CheckpointFileError`` (read side) so the
caller can turn each into one warning and keep serving.

Design notes
 * Layout: ``<checkpoint_dir>/<model-key>/<prefix-hash>.ckpt`` and the page files they reference,
   ``<model-key>/pages/<prefix-hash>.page`` (page_format.py), one subdirectory per checkpoint
   fingerprint (``model_key``: blake2b-64 of the fingerprint), so several models share one
   checkpoint directory without touching each other's files. The subdirectory holds ``lock`` and
   ``fingerprint`` (the full fingerprint, for the operator) besides the checkpoint files.
 * One daemon per model subdirectory: ``lock_model_dir`` takes an exclusive ``flock`` on ``lock``
   for the daemon's lifetime (the kernel drops it when the process dies, however it dies). A second
   daemon of the same model gets ``DirectoryBusy`` and runs with its disk tier off. So while we hold
   the lock nobody else writes there, which is what makes a temp file provably abandoned: ``scan``
   (run under the lock, before our writer starts) removes temp files; nothing ever removes a file
   in another model's subdirectory.
 * A write goes to ``.<name>.<pid>-<rand>.tmp`` in the same directory (same file system, so the
   rename is atomic), is fsynced, renamed over ``<name>``, then the directory is fsynced so the
   rename itself survives a power cut. A crash at any point leaves either no ``<name>`` or the
   complete one, plus at worst a temp file that the next lock holder removes.
 * Recency (the disk tier's LRU) is the file's mtime: set to the entry's last use (``touch``), read
   back by ``scan``, so eviction order survives a restart.
 * Page files are deleted when the last checkpoint referencing them leaves (the store's
   ``pages_freed``) and, at start-up, when no checkpoint file references them (``remove_orphan_pages``).
   A page a new checkpoint reuses gets its mtime refreshed before that checkpoint is published:
   a shared directory's sweep deletes only unreferenced pages older than its grace.
 * Only files we own are touched: ``*.ckpt``, ``pages/*.page`` and our temp-file pattern in our model's
   subdirectory. Anything else is left. Files of our fingerprint left at the top level by the
   flat layout of earlier versions are moved into the subdirectory (``adopt_flat_files``).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import secrets
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from . import page_format
from .disk_format import (SUFFIX, CheckpointFileError, Header, as_tokens, encode_header, file_name, page_keys,
                          read_header, read_payload)

TMP_SUFFIX = ".tmp"
LOCK_NAME = "lock"
FINGERPRINT_NAME = "fingerprint"

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class Problem:
    """A file ``scan`` refused; ``removed`` is False when it was left in place (not ours, or the
    unlink failed)."""

    path: Path
    reason: str
    removed: bool


@dataclass(frozen=True, slots=True)
class Found:
    """A usable checkpoint file: its header and its mtime (the entry's last use)."""

    path: Path
    header: Header
    last_used: float


class DirectoryBusy(OSError):
    """Another process holds the model subdirectory's lock (a second daemon of the same model)."""

    def __init__(self, path: Path, holder: str):
        super().__init__(f"{path} is in use by another cairn daemon ({holder or 'pid unknown'})")
        self.path = path
        self.holder = holder


class DirLock:
    """The held lock of one model subdirectory; ``close`` releases it (so does process exit)."""

    def __init__(self, path: Path, fd: int):
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)   # closing the only descriptor of the open file releases the flock


def model_key(fingerprint: str) -> str:
    """The subdirectory name of a checkpoint fingerprint: 16 hex digits (blake2b-64)."""
    return hashlib.blake2b(fingerprint.encode(), digest_size=8).hexdigest()


def model_subdir(root: str | os.PathLike, fingerprint: str) -> Path:
    return Path(root) / model_key(fingerprint)


def ensure_dir(path: str | os.PathLike) -> Path:
    """Create the checkpoint directory (mode 0700) if needed."""
    p = Path(path)
    p.mkdir(mode=0o700, parents=True, exist_ok=True)
    return p


def lock_model_dir(root: str | os.PathLike, fingerprint: str) -> tuple[Path, DirLock]:
    """Create ``root/<model-key>`` (mode 0700) and take its lock without waiting. Raises
    ``DirectoryBusy`` when another daemon holds it, ``OSError`` when the directory is unusable.
    The lock file records the holder's pid, for the second daemon's warning."""
    sub = ensure_dir(model_subdir(ensure_dir(root), fingerprint))
    fd = os.open(sub / LOCK_NAME, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
            raise DirectoryBusy(sub, holder) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
        try:
            if (sub / FINGERPRINT_NAME).read_text() == fingerprint:
                return sub, DirLock(sub, fd)
        except (FileNotFoundError, UnicodeDecodeError):
            pass
        atomic_write(sub, FINGERPRINT_NAME, fingerprint.encode())
        return sub, DirLock(sub, fd)
    except BaseException:
        os.close(fd)
        raise


def older_formats(root: str | os.PathLike, fingerprint: str) -> list[tuple[Path, int, int]]:
    """Subdirectories of ``root`` holding this model's checkpoints in another snapshot format (the
    fingerprint's part before ``;snapshot-`` matches, the rest does not): (path, files, bytes) each.
    They are never read (another fingerprint); the operator may delete them."""
    model = fingerprint.split(";snapshot-")[0]
    out = []
    try:
        subs = [p for p in Path(root).iterdir() if p.is_dir()]
    except FileNotFoundError:
        return []
    for sub in subs:
        try:
            fp = (sub / FINGERPRINT_NAME).read_text()
        except (OSError, UnicodeDecodeError):
            continue
        if fp != fingerprint and fp.split(";snapshot-")[0] == model and ";snapshot-" in fp:
            files = [f for f in sub.rglob("*") if f.is_file() and f.name not in (FINGERPRINT_NAME, "lock")]
            out.append((sub, len(files), sum(f.stat().st_size for f in files)))
    return out


def adopt_flat_files(root: str | os.PathLike, sub: str | os.PathLike, fingerprint: str) -> list[Path]:
    """Move ``*.ckpt`` files of ``fingerprint`` from the top level of ``root`` (the flat layout of
    earlier versions) into ``sub``; call it holding ``sub``'s lock. Files of other fingerprints,
    bad files and temp files at the top level are left alone: they may be another daemon's."""
    moved: list[Path] = []
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return moved
    for name in names:
        path = Path(root) / name
        if not name.endswith(SUFFIX) or not path.is_file():
            continue
        try:
            with open(path, "rb") as f:
                read_header(f, fingerprint)
        except (CheckpointFileError, OSError):
            continue
        try:
            os.replace(path, Path(sub) / name)
        except OSError:
            continue
        moved.append(Path(sub) / name)
    if moved:
        _fsync_dir(Path(sub))
    return moved


def write_checkpoint(directory: str | os.PathLike, fingerprint: str, kind: str,
                     tokens: Sequence[int] | np.ndarray, snapshot, last_used: float | None = None
                     ) -> tuple[int, list[tuple[str, int]]]:
    """Write a kernel Snapshot: each full page group that has no file yet as
    ``directory/pages/<key>.page``, then ``directory/<prefix-hash>.ckpt`` (header and tail), each
    atomically and durably, pages first (a reader never finds a checkpoint whose pages are still
    being written). The checkpoint's mtime is set to ``last_used`` when given. Returns the
    checkpoint file's size and the page files it references, (name, bytes) each. A bytes-like
    ``snapshot`` is written as a tail with no pages (opaque blobs: tools and tests without a kernel)."""
    ids = as_tokens(tokens)
    if isinstance(snapshot, (bytes, bytearray, memoryview)):
        n_pages = page_nbytes = page_tokens = 0
        tail = snapshot
    else:
        n_pages, page_nbytes = int(snapshot.n_full_pages), int(snapshot.page_nbytes)
        page_tokens, tail = int(snapshot.page_tokens), snapshot.tail()
    pages_dir = ensure_dir(Path(directory) / page_format.DIR) if n_pages else None
    manifest, files, reused = [], [], []
    for k, key in enumerate(page_keys(ids, n_pages, page_tokens)):
        name = page_format.file_name(key)
        crc = _reuse_page(pages_dir / name, page_nbytes)
        if crc is None:                  # new (or torn): checksum and write it; a stored page is never re-read
            crc = _write_page(pages_dir, name, snapshot.page(k))
        else:
            reused.append(k)
        manifest.append((key, crc))
        files.append((name, page_format.file_size(page_nbytes)))
    header = encode_header(fingerprint, kind, ids, tail, page_nbytes, manifest)
    path = atomic_write(directory, file_name(ids), [header, tail])
    # A shared directory's sweep that read the page's old mtime just before _reuse_page refreshed it
    # may still have deleted it: now that the checkpoint references it, no sweep will again.
    for k in reused:
        if not (pages_dir / files[k][0]).exists():
            _write_page(pages_dir, files[k][0], snapshot.page(k))
    if last_used is not None:
        os.utime(path, (last_used, last_used))
    return len(header) + len(tail), files


def _write_page(pages_dir: Path, name: str, view) -> int:
    """Write one page file; its payload CRC."""
    header = page_format.encode_header(view)
    atomic_write(pages_dir, name, [header, view])
    return struct.unpack_from("<I", header, 16)[0]


def _reuse_page(path: Path, page_nbytes: int) -> int | None:
    """An existing page file to reference instead of writing it again: its CRC, its mtime set to now
    first. The mtime is its age for a shared directory's sweep of unreferenced pages
    (shared_dir.evict_pass): a page last written long ago is otherwise deleted as an orphan between
    this reuse and the publish of the checkpoint that references it. None (write it) when absent,
    not a whole page file, or its mtime cannot be set (another owner)."""
    crc = _existing_page_crc(path, page_nbytes)
    if crc is None:
        return None
    try:
        os.utime(path)
    except (FileNotFoundError, PermissionError):   # gone meanwhile, or a peer's file: write our own
        return None
    return crc


def _existing_page_crc(path: Path, page_nbytes: int) -> int | None:
    """The CRC in the header of an existing page file of the right size: written before, by us or a
    peer, for the same prefix (the same bits, since the kernel is deterministic). None when absent or
    not a whole page file (rewritten). The content is checked against this CRC when it is loaded."""
    try:
        with open(path, "rb") as f:
            head = f.read(page_format.HEADER_SIZE)
            size = os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        return None
    if len(head) < page_format.HEADER_SIZE or size != page_format.file_size(page_nbytes) or head[:8] != page_format.MAGIC:
        return None
    return struct.unpack_from("<I", head, 16)[0]


def touch(directory: str | os.PathLike, times: dict[str, float]) -> None:
    """Record last uses: file name -> Unix time, as the file's mtime. Vanished files are skipped."""
    for name, t in times.items():
        try:
            os.utime(Path(directory) / name, (t, t))
        except FileNotFoundError:
            pass


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


def load(path: str | os.PathLike, fingerprint: str) -> tuple[Header, bytes, list[memoryview]]:
    """Header, verified tail and verified page groups of one checkpoint. Raises
    ``CheckpointFileError`` (bad file: the caller should ``remove`` it; a missing or damaged page
    says which) or ``OSError`` (file gone, unreadable)."""
    path = Path(path)
    with open(path, "rb") as f:
        header = read_header(f, fingerprint)
        tail = read_payload(f, header)
    pages = []
    for k, (key, crc) in enumerate(header.pages):
        page_path = path.parent / page_format.DIR / page_format.file_name(key)
        try:
            with open(page_path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise CheckpointFileError(f"page {k} of {len(header.pages)} is missing ({page_path.name})") from None
        try:
            pages.append(page_format.decode(data, expect_len=header.page_nbytes, expect_crc=crc))
        except CheckpointFileError as e:
            bad = CheckpointFileError(f"page {k} of {len(header.pages)} ({page_path.name}): {e.reason}")
            bad.page = page_path.name      # the damaged page file: bad for every checkpoint that needs it
            raise bad from None
    return header, tail, pages


def page_files(header: Header) -> list[tuple[str, int]]:
    """The page files a checkpoint header references, (name, bytes) each."""
    size = page_format.file_size(header.page_nbytes)
    return [(page_format.file_name(key), size) for key, _ in header.pages]


def remove_page(directory: str | os.PathLike, name: str) -> bool:
    return remove(Path(directory) / page_format.DIR, name)


def remove_orphan_pages(directory: str | os.PathLike, referenced: set[str], *, older_than: float | None = None) -> list[str]:
    """Delete page files no checkpoint references (``referenced``: names). ``older_than``: only
    those last modified before that Unix time (a peer may be publishing: pages go first)."""
    d = Path(directory) / page_format.DIR
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return []
    removed = []
    for name in names:
        if older_than is None and name.startswith(".") and name.endswith(TMP_SUFFIX):
            remove(d, name)     # under the lock: an interrupted page write
            continue
        if not name.endswith(page_format.SUFFIX) or name in referenced:
            continue
        if older_than is not None:
            try:
                if os.stat(d / name).st_mtime >= older_than:
                    continue
            except FileNotFoundError:
                continue
        if remove(d, name):
            removed.append(name)
    return removed


def remove(directory: str | os.PathLike, name: str) -> bool:
    """Delete ``directory/name`` if present; True when a file was removed."""
    try:
        os.unlink(Path(directory) / name)
        return True
    except FileNotFoundError:
        return False


def scan(directory: str | os.PathLike, fingerprint: str) -> tuple[list[Found], list[Problem]]:
    """The usable checkpoint files in our model subdirectory, least recently used first, and the
    problems found. Call it holding the directory's lock (``lock_model_dir``): temp files are then
    abandoned and removed, and so are ``*.ckpt`` files that are truncated, corrupt, of another
    version, or misnamed. A file of another fingerprint is reported and left in place (it is not
    ours to delete). A missing directory is empty."""
    d = Path(directory)
    try:
        names = sorted(os.listdir(d))
    except FileNotFoundError:
        return [], []
    temps = [_reject(d / n, "leftover temp file (interrupted write)")
             for n in names if n.startswith(".") and n.endswith(TMP_SUFFIX)]
    good, problems = examine(d, [n for n in names if n.endswith(SUFFIX) and not n.startswith(".")], fingerprint)
    return good, temps + problems


def examine(directory: str | os.PathLike, names: Iterable[str], fingerprint: str) -> tuple[list[Found], list[Problem]]:
    """Read and check the headers of the ``*.ckpt`` files ``names`` (scan, and the shared tier's
    listings). Usable ones come back least recently used first. Damaged ones (corrupt, truncated,
    other version, misnamed) are removed: bad for every reader. One of another fingerprint, or one
    that cannot be read, is reported and left in place. A name gone before it is opened (evicted by
    another daemon) or that is not a regular file is skipped."""
    d = Path(directory)
    good: list[Found] = []
    problems: list[Problem] = []
    for name in names:
        path = d / name
        try:
            if not path.is_file():       # before the open: opening a FIFO would block
                continue
            with open(path, "rb") as f:
                header = read_header(f)
                st = os.fstat(f.fileno())
        except FileNotFoundError:
            continue
        except CheckpointFileError as e:
            problems.append(_reject(path, e.reason))
            continue
        except OSError as e:
            problems.append(Problem(path, f"unreadable: {e.strerror or e}", False))
            continue
        if header.fingerprint != fingerprint:
            problems.append(Problem(path, "foreign fingerprint; left in place", False))
        elif st.st_size < header.file_len:
            problems.append(_reject(path, "truncated"))
        elif st.st_size > header.file_len:
            problems.append(_reject(path, "trailing bytes"))
        elif header.name != name:
            problems.append(_reject(path, "file name does not match its token ids"))
        else:
            good.append(Found(path, header, st.st_mtime))
    good.sort(key=lambda f: (f.last_used, f.path.name))
    return good, problems


def _reject(path: Path, reason: str) -> Problem:
    """Remove a bad file; the Problem says whether it is gone."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        return Problem(path, f"{reason}; not removed: {e.strerror or e}", False)
    return Problem(path, reason, True)
