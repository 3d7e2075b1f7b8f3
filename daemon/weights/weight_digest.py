"""Whole-file digests of weight shards for the model fingerprint, cached across restarts.

Design notes
 * Every byte of every shard is hashed (sha256, 1 MiB reads into one reused buffer; shards in parallel threads, since hashlib
   releases the GIL): a sampled
   digest misses an edited tensor, and then disk checkpoints of the old weights would restore into
   the new model. sha256 is the fastest hash in the standard library on CPUs with SHA extensions
   (measured in docs/model-format.md: ~0.85 GB/s, blake2b ~0.37 GB/s on the same machine).
 * The cost is paid once per shard: the digest is cached by (resolved path, size, mtime_ns,
   ctime_ns, inode, device). Any write to the file changes mtime and ctime (ctime cannot be set
   back from user space), a replaced file has a new inode, so a stale entry is never used.
 * The cache is one JSON file in a directory the daemon may write (the checkpoint directory,
   ``checkpoint_dir``), never in the model directory, which is only read. It is written atomically
   (temp file + rename); a cache that cannot be read is ignored, one that cannot be written costs a
   rehash at the next start and one warning.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CACHE_NAME = "weight-digests.json"
CACHE_VERSION = 1
READ_SIZE = 1 << 20   # fits the CPU caches; measured faster than 256 KiB or 8 MiB reads


def file_digest(path: str | os.PathLike) -> str:
    """sha256 of the whole file, hex."""
    h = hashlib.sha256()
    buf = bytearray(READ_SIZE)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


class DigestCache:
    """Digests by file identity, loaded from and saved to ``file`` (None: nothing is kept)."""

    def __init__(self, file: str | os.PathLike | None) -> None:
        self.file = Path(file) if file is not None else None
        self._entries: dict[str, dict] = self._read()
        self._dirty = False
        self.hashed: list[Path] = []      # files read in full by this instance (for the log)

    def _read(self) -> dict[str, dict]:
        if self.file is None:
            return {}
        try:
            data = json.loads(self.file.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("version") != CACHE_VERSION or not isinstance(data.get("files"), dict):
            return {}
        return data["files"]

    def digest(self, path: str | os.PathLike) -> str:
        return self.digest_all([path])[0]

    def digest_all(self, paths: list[str | os.PathLike], workers: int | None = None) -> list[str]:
        """The digests of ``paths`` (in order): cached ones at once, the others hashed in up to
        ``workers`` threads (default: one per core)."""
        resolved = [Path(p).resolve() for p in paths]
        idents = [_identity(os.stat(p)) for p in resolved]
        out: list[str | None] = []
        todo: list[int] = []
        for i, (p, ident) in enumerate(zip(resolved, idents)):
            rec = self._entries.get(str(p))
            if isinstance(rec, dict) and rec.get("identity") == ident and isinstance(rec.get("sha256"), str):
                out.append(rec["sha256"])
            else:
                out.append(None)
                todo.append(i)
        if todo:
            n = max(1, min(len(todo), workers or os.cpu_count() or 1))
            with ThreadPoolExecutor(max_workers=n, thread_name_prefix="weight-digest") as ex:
                for i, digest in zip(todo, ex.map(file_digest, [resolved[i] for i in todo])):
                    out[i] = digest
                    self.hashed.append(resolved[i])
                    if _identity(os.stat(resolved[i])) == idents[i]:   # unchanged while read: keep it
                        self._entries[str(resolved[i])] = {"identity": idents[i], "sha256": digest}
                        self._dirty = True
        return out  # type: ignore[return-value]

    def save(self) -> None:
        """Write the cache if anything was added (atomically). Raises OSError."""
        if self.file is None or not self._dirty:
            return
        d = self.file.parent
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        merged = {**self._read(), **self._entries}      # keep what another daemon added meanwhile
        merged = {k: v for k, v in merged.items() if Path(k).exists()}
        tmp = d / f".{self.file.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump({"version": CACHE_VERSION, "files": merged}, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.file)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self._dirty = False
