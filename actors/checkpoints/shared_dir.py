"""File effects of the SHARED checkpoint tier: one model subdirectory used by many daemons at once.

Blocking calls, for worker threads. The exclusive tier (disk_io.lock_model_dir) gives a model's
subdirectory to one daemon; ``--shared-checkpoint-dir`` instead lets every daemon of the model (on
this machine or others, over a shared file system) write, read and evict in it.

Design notes
 * Content-addressed: ``<prefix-hash>.ckpt`` (disk_format.py), the header carries the fingerprint
   and the full token ids, so two daemons that capture the same prefix write the same name with
   the same content; a name already present is not written again.
 * Published atomically: temp file in the same directory, fsync, rename (disk_io.atomic_write). A
   reader sees no file or the complete one.
 * Discovered while running: ``changes`` lists the directory and reads the headers of names not
   seen before, and reports names that vanished; the caller runs it in the background when the
   directory's mtime changed (one ``stat``), under a deadline, so a daemon finds its peers'
   checkpoints and a hung mount never holds a request (Checkpoints.refresh_loop).
 * Read safely while another daemon evicts: a reader opens the file and reads it whole
   (disk_io.load); an unlink after the open does not touch the open file. A file gone before the
   open is a miss, never an error; a damaged file fails its CRC and is skipped (and removed).
 * Pages: ``pages/<prefix-hash>.page`` (page_format.py), content-addressed like the checkpoints,
   so daemons share them too; a writer publishes a checkpoint's pages before the checkpoint.
 * One byte budget: an eviction pass takes the lease (an exclusive ``flock`` on ``evict.lock``,
   held only for the pass), lists every file and reads the checkpoints' headers (which pages
   each references), and deletes least recently used checkpoints first (shared_evict.py) until
   the checkpoints and the pages they reference fit, then the page files nothing references that
   are older than ``PAGE_GRACE_S`` (younger ones may belong to a checkpoint being published; a
   writer refreshes the mtime of each page it reuses before it publishes, disk_io.write_checkpoint).
   A checkpoint whose header cannot be read during the pass skips that sweep (its pages are
   unknown). Only this pass deletes pages in a shared directory: a daemon's own index may lack its
   peers' newest checkpoints (Checkpoints._unlink_orphans). Passes are serialised, so daemons never delete for
   the same overflow twice, and each deletes by the same global order instead of its own files
   at random. The pass also removes temp files older than ``TMP_GRACE_S`` (a crashed writer's).
 * Requirements on a shared file system: atomic rename within a directory, ``flock`` visible to
   every client (NFSv4, CephFS, GlusterFS do; NFSv3 without lockd does not), mtimes settable by
   every daemon (same uid or group-writable files). docs/operations.md "Scale-out".
"""

from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path

from . import disk_io
from .disk_format import SUFFIX, CheckpointFileError, read_header
from .shared_evict import FileStat, abandoned_temps, choose_victims

LEASE_NAME = "evict.lock"
TMP_GRACE_S = 600.0
PAGE_GRACE_S = 600.0   # an unreferenced page file younger than this may be a publish in progress
LEASE_WAIT_S = 5.0     # a pass waits this long for another daemon's pass, then is skipped


@dataclass(frozen=True, slots=True)
class Changes:
    """What ``changes`` found: usable new files, names that vanished, bad files removed."""

    found: list[disk_io.Found]
    gone: list[str]
    problems: list[disk_io.Problem]


@dataclass(frozen=True, slots=True)
class PassResult:
    removed: list[str]        # checkpoint file names deleted by this pass
    temps_removed: int
    bytes_after: int
    skipped: bool = False     # the lease stayed busy for LEASE_WAIT_S: nothing was done (the next pass will)
    pages_removed: int = 0    # page files no remaining checkpoint references
    unreadable: tuple[str, ...] = ()   # checkpoints whose header could not be read: no page sweep this pass


def open_shared(root: str | os.PathLike, fingerprint: str) -> Path:
    """Create ``root/<model-key>`` (mode 0700 unless it exists) and record the fingerprint."""
    sub = disk_io.ensure_dir(disk_io.model_subdir(disk_io.ensure_dir(root), fingerprint))
    try:
        if (sub / disk_io.FINGERPRINT_NAME).read_text() == fingerprint:
            return sub
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    disk_io.atomic_write(sub, disk_io.FINGERPRINT_NAME, fingerprint.encode())
    return sub


def dir_mtime(sub: str | os.PathLike) -> int:
    """The directory's mtime in ns: it changes with every file created, renamed or removed in it."""
    return os.stat(sub).st_mtime_ns


def changes(sub: str | os.PathLike, fingerprint: str, known: set[str]) -> Changes:
    """New usable ``*.ckpt`` files (their headers read, disk_io.examine) and names in ``known`` that
    are gone. A new file that is damaged is removed (it is bad for every daemon); one of another
    fingerprint is left alone."""
    names = {n for n in os.listdir(sub) if n.endswith(SUFFIX) and not n.startswith(".")}
    found, problems = disk_io.examine(sub, sorted(names - known), fingerprint)
    return Changes(found, sorted(known - names), problems)


def evict_pass(sub: str | os.PathLike, max_bytes: int, *, now: float | None = None,
               tmp_grace_s: float = TMP_GRACE_S, lease_wait_s: float = LEASE_WAIT_S,
               page_grace_s: float = PAGE_GRACE_S) -> PassResult:
    """Under the lease: delete least recently used files until the directory fits ``max_bytes``,
    and temp files abandoned for longer than ``tmp_grace_s``. Waits up to ``lease_wait_s`` for
    another daemon's pass; a lease still busy then (a peer stuck on a hung mount) skips this pass
    rather than stall the writer: the budget is overrun by at most the files written meanwhile."""
    d = Path(sub)
    fd = os.open(d / LEASE_NAME, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        if not _take_lease(fd, lease_wait_s):     # held for one pass only; process death releases it
            return PassResult([], 0, -1, skipped=True)
        files, temps, unreadable = _listing(d)
        removed = []
        for victim in choose_victims(files, max_bytes):
            disk_io.remove(d, victim.name)
            removed.append(victim.name)
        t_now = time.time() if now is None else now
        stale = abandoned_temps(temps, t_now, tmp_grace_s)
        for t in stale:
            disk_io.remove(d, t.name)
        gone = set(removed)
        kept = [f for f in files if f.name not in gone]
        referenced = {name for f in kept for name, _ in f.pages}
        # A checkpoint whose header was not read references pages this pass cannot name: sweeping
        # would delete them. Skip the sweep; a later pass (the file fixed, or evicted) does it.
        pages = [] if unreadable else disk_io.remove_orphan_pages(d, referenced, older_than=t_now - page_grace_s)
        page_bytes = sum(size for name, size in {p for f in kept for p in f.pages})
        return PassResult(removed, len(stale), sum(f.size for f in kept) + page_bytes, pages_removed=len(pages),
                          unreadable=tuple(unreadable))
    finally:
        os.close(fd)


def _take_lease(fd: int, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)   # a worker thread polling a lock, not a test waiting: passes take milliseconds


def _listing(d: Path) -> tuple[list[FileStat], list[FileStat], list[str]]:
    """Checkpoint files (with the pages each references), temp files, and the checkpoints whose
    header could not be read (damaged, or an I/O error): their pages are unknown."""
    files: list[FileStat] = []
    temps: list[FileStat] = []
    unreadable: list[str] = []
    for name in os.listdir(d):
        is_tmp = name.startswith(".") and name.endswith(disk_io.TMP_SUFFIX)
        if not (is_tmp or name.endswith(SUFFIX)):
            continue
        try:
            st = os.stat(d / name)
        except FileNotFoundError:
            continue
        if is_tmp:
            temps.append(FileStat(name, st.st_size, st.st_mtime))
            continue
        try:
            with open(d / name, "rb") as f:
                pages = tuple(disk_io.page_files(read_header(f)))
        except FileNotFoundError:
            continue     # evicted or deleted since the listing: it references nothing now
        except (OSError, CheckpointFileError):
            pages = ()   # still counted and evictable; a reader removes a damaged one
            unreadable.append(name)
        files.append(FileStat(name, st.st_size, st.st_mtime, pages))
    return files, temps, unreadable
