"""Checkpoint files: pure encode / decode of the on-disk format (no file-system effects here).

Design notes
 * One file per stored prefix, named ``<prefix-hash>.ckpt`` where the hash is blake2b-64 of the
   token ids as little-endian int32 (``prefix_hash``). The same hash is the store's entry id, so a
   file and an index entry name each other; the ids inside the header are what is trusted.
 * The payload is the kernel's snapshot tail (everything but the full page groups). The full
   groups are page files (page_format.py), stored once each and named by the hash of the token
   prefix they close: the kernel is bit-identical under any chunking, so the same prefix always
   gives the same page, and two checkpoints of one conversation (or two daemons of one model)
   share the files. The header lists them in order with each one's CRC-32, so a page file that is
   missing, damaged or replaced is caught before the kernel sees it.
 * The header carries everything the index needs (fingerprint, kind, token ids, payload length),
   so a restart rebuilds the index by reading headers only; payloads are loaded lazily on restore.
 * Before a restore the page keys are recomputed from the header's token ids (``check_page_keys``):
   a file that lists another prefix's pages (planted, or a bug) is refused, since the kernel state's
   own tokens, checked after the restore, come from the tail and would not tell.
 * Checksums are CRC-32 (zlib): one over the header, one over the payload, stored in the header.
   They guard against accidental damage (torn writes that escaped the atomic rename, bit rot,
   truncation by a full disk), not against an adversary: the directory is ours (mode 0700).
   CRC-32 is the fastest option in the standard library (~1.2 GB/s here, vs ~0.8 for sha256 and
   ~0.3 for blake2b), 4 bytes, and the kernel's snapshot blob carries its own checksum as well.
   The header CRC lets ``read_header`` reject a damaged header without touching the payload.
 * The version is checked before anything else past the magic, so a future layout (version 2)
   is reported as "wrong version 3 (expected 2)", never as a checksum error.

Layout (little-endian)::

    off  size  field
      0     8  magic            b"CAIRNCKP"
      8     4  version          u32 = 2 (1: the whole state in the payload, before pages)
     12     4  header_len       u32: bytes from offset 0 up to and including header_crc
     16     1  kind             u8: 0 system, 1 common, 2 prompt_end
     17     3  reserved         zero
     20     4  fingerprint_len  u32 (<= 4096)
     24     8  n_tokens         u64 (<= 2**26)
     32     8  payload_len      u64
     40     4  payload_crc      u32 = crc32(payload)
     44     F  fingerprint      utf-8
   44+F   4n  tokens           int32[n]
      …     4  page_nbytes      u32: bytes of one page group
      …     4  n_pages          u32 = n // page_tokens
      …  12k  pages            per full page group, in order: 8-byte key (prefix hash) | u32 crc32
      …     4  header_crc       u32 = crc32(all header bytes before it)
 header_len P  payload          the kernel's snapshot tail, opaque here
"""

from __future__ import annotations

import hashlib
import io
import struct
import zlib
from dataclasses import dataclass
from typing import BinaryIO, Sequence

import numpy as np

MAGIC = b"CAIRNCKP"
VERSION = 2
SUFFIX = ".ckpt"
KINDS = ("system", "common", "prompt_end")
MAX_FINGERPRINT = 4096
MAX_TOKENS = 1 << 26

_PREAMBLE = struct.Struct("<8sII")  # magic, version, header_len
_FIXED = struct.Struct("<8sIIB3xIQQI")  # the 44 fixed bytes
_CRC = struct.Struct("<I")
_PAGES = struct.Struct("<II")       # page_nbytes, n_pages
_PAGE = struct.Struct("<8sI")        # key, crc32
MAX_PAGES = 1 << 20


class CheckpointFileError(ValueError):
    """A checkpoint file that must not be used; ``reason`` is a short phrase for the log."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason
        self.page: str | None = None   # a damaged page file's name, when that is what is wrong


@dataclass(frozen=True, slots=True)
class Header:
    version: int
    fingerprint: str
    kind: str
    tokens: np.ndarray  # (n_tokens,) int32, read-only
    payload_len: int
    payload_crc: int
    header_len: int
    page_nbytes: int = 0
    pages: tuple[tuple[str, int], ...] = ()   # (page key, crc32) of each full page group, in order

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def file_len(self) -> int:
        return self.header_len + self.payload_len

    @property
    def name(self) -> str:
        return file_name(self.tokens)


def as_tokens(tokens: Sequence[int] | np.ndarray) -> np.ndarray:
    """Token ids as a contiguous int32 array (no copy when already one)."""
    arr = np.ascontiguousarray(tokens, dtype=np.int32)
    if arr.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {arr.shape}")
    return arr


def prefix_hash(tokens: Sequence[int] | np.ndarray) -> str:
    """16 hex digits identifying a token-id prefix (blake2b-64 of int32 LE ids)."""
    return hashlib.blake2b(as_tokens(tokens).astype("<i4", copy=False).tobytes(), digest_size=8).hexdigest()


def file_name(tokens: Sequence[int] | np.ndarray) -> str:
    return prefix_hash(tokens) + SUFFIX


def page_key(tokens: Sequence[int] | np.ndarray, k: int, page_tokens: int) -> str:
    """The name of page group k of a state after ``tokens``: the hash of the prefix it closes."""
    return prefix_hash(as_tokens(tokens)[: (k + 1) * page_tokens])


def page_keys(tokens: Sequence[int] | np.ndarray, n_pages: int, page_tokens: int) -> list[str]:
    """``page_key`` for k = 0 .. n_pages-1, in one incremental hashing pass."""
    raw = as_tokens(tokens).astype("<i4", copy=False).tobytes()
    h, out = hashlib.blake2b(digest_size=8), []
    for k in range(n_pages):
        h.update(raw[4 * k * page_tokens: 4 * (k + 1) * page_tokens])
        out.append(h.copy().hexdigest())
    return out


def check_page_keys(header: Header, page_tokens: int) -> None:
    """A checkpoint's pages must be the pages of its own token ids: one per full group of
    ``page_tokens``, each keyed by the hash of the prefix it closes (``page_keys``: one hashing
    pass). Raises ``CheckpointFileError`` otherwise: its pages would hold another prefix's state,
    and no other check would notice (the restored state's tokens come from the tail)."""
    want = header.n_tokens // page_tokens if page_tokens > 0 else 0
    if len(header.pages) != want:
        raise CheckpointFileError(f"page keys do not match its token ids ({len(header.pages)} pages listed, "
                                  f"{header.n_tokens} tokens make {want})")
    expected = page_keys(header.tokens, want, page_tokens)
    for k, (key, _) in enumerate(header.pages):
        if key != expected[k]:
            raise CheckpointFileError(f"page keys do not match its token ids (page {k} of {want})")


def header_size(fingerprint: str, n_tokens: int, n_pages: int = 0) -> int:
    """The length of ``encode_header``'s result, without computing any checksum."""
    return _FIXED.size + len(fingerprint.encode()) + 4 * n_tokens + _PAGES.size + _PAGE.size * n_pages + _CRC.size


def encode_header(fingerprint: str, kind: str, tokens: Sequence[int] | np.ndarray, payload: bytes | memoryview,
                  page_nbytes: int = 0, pages: Sequence[tuple[str, int]] = ()) -> bytes:
    """The header for ``payload`` (and the page files it references, (key, crc32) each); write it
    followed by the payload (see ``encode``)."""
    if kind not in KINDS:
        raise ValueError(f"unknown checkpoint kind {kind!r}")
    fp = fingerprint.encode()
    if len(fp) > MAX_FINGERPRINT:
        raise ValueError("fingerprint too long")
    ids = as_tokens(tokens).astype("<i4", copy=False)
    if ids.shape[0] > MAX_TOKENS:
        raise ValueError("too many tokens")
    header_len = header_size(fingerprint, ids.shape[0], len(pages))
    body = b"".join((
        _FIXED.pack(MAGIC, VERSION, header_len, KINDS.index(kind), len(fp), ids.shape[0], len(payload),
                    zlib.crc32(payload)),
        fp,
        ids.tobytes(),
        _PAGES.pack(page_nbytes, len(pages)),
        *(_PAGE.pack(bytes.fromhex(key), crc) for key, crc in pages),
    ))
    return body + _CRC.pack(zlib.crc32(body))


def encode(fingerprint: str, kind: str, tokens: Sequence[int] | np.ndarray, payload: bytes,
           page_nbytes: int = 0, pages: Sequence[tuple[str, int]] = ()) -> bytes:
    """A whole checkpoint file in memory. For large payloads prefer writing
    ``[encode_header(...), payload]`` to avoid the copy (``disk_io.atomic_write`` takes a list)."""
    return encode_header(fingerprint, kind, tokens, payload, page_nbytes, pages) + bytes(payload)


def read_header(source: bytes | bytearray | memoryview | BinaryIO, fingerprint: str | None = None) -> Header:
    """Parse and verify a header from bytes or a binary file positioned at offset 0.

    Raises ``CheckpointFileError`` with reason "bad magic", "wrong version V (expected 2)",
    "truncated", "corrupt header (...)", "checksum mismatch (header)" or, when ``fingerprint``
    is given and differs, "foreign fingerprint".
    """
    f = io.BytesIO(source) if isinstance(source, (bytes, bytearray, memoryview)) else source
    pre = f.read(_PREAMBLE.size)
    if len(pre) < len(MAGIC) or pre[: len(MAGIC)] != MAGIC:
        raise CheckpointFileError("truncated" if MAGIC.startswith(pre) else "bad magic")
    if len(pre) < _PREAMBLE.size:
        raise CheckpointFileError("truncated")
    _, version, header_len = _PREAMBLE.unpack(pre)
    if version != VERSION:
        raise CheckpointFileError(f"wrong version {version} (expected {VERSION})"
                                  + ("; written before paged state, so it is recomputed" if version < VERSION else ""))
    if not (_FIXED.size + _PAGES.size + _CRC.size <= header_len <=
            _FIXED.size + MAX_FINGERPRINT + 4 * MAX_TOKENS + _PAGES.size + _PAGE.size * MAX_PAGES + _CRC.size):
        raise CheckpointFileError("corrupt header (length)")
    rest = f.read(header_len - _PREAMBLE.size)
    if len(rest) < header_len - _PREAMBLE.size:
        raise CheckpointFileError("truncated")
    raw = pre + rest
    (stored_crc,) = _CRC.unpack_from(raw, header_len - _CRC.size)
    if zlib.crc32(raw[: header_len - _CRC.size]) != stored_crc:
        raise CheckpointFileError("checksum mismatch (header)")
    _, _, _, kind_code, fp_len, n_tokens, payload_len, payload_crc = _FIXED.unpack_from(raw, 0)
    if kind_code >= len(KINDS):
        raise CheckpointFileError(f"corrupt header (kind {kind_code})")
    at = _FIXED.size + fp_len + 4 * n_tokens
    if at + _PAGES.size + _CRC.size > header_len:
        raise CheckpointFileError("corrupt header (lengths disagree)")
    page_nbytes, n_pages = _PAGES.unpack_from(raw, at)
    if at + _PAGES.size + _PAGE.size * n_pages + _CRC.size != header_len:
        raise CheckpointFileError("corrupt header (lengths disagree)")
    pages = tuple((key.hex(), crc) for key, crc in _PAGE.iter_unpack(raw[at + _PAGES.size: header_len - _CRC.size]))
    try:
        fp = raw[_FIXED.size: _FIXED.size + fp_len].decode()
    except UnicodeDecodeError:
        raise CheckpointFileError("corrupt header (fingerprint)") from None
    if fingerprint is not None and fp != fingerprint:
        raise CheckpointFileError("foreign fingerprint")
    tokens = np.frombuffer(raw, dtype="<i4", count=n_tokens, offset=_FIXED.size + fp_len).astype(np.int32)
    tokens.flags.writeable = False
    return Header(VERSION, fp, KINDS[kind_code], tokens, payload_len, payload_crc, header_len, page_nbytes, pages)


def read_payload(source: bytes | bytearray | memoryview | BinaryIO, header: Header) -> bytes:
    """The payload after ``header``, verified: raises "truncated", "trailing bytes" or
    "checksum mismatch". ``source`` is the whole file's bytes or a seekable binary file."""
    f = io.BytesIO(source) if isinstance(source, (bytes, bytearray, memoryview)) else source
    f.seek(header.header_len)
    payload = f.read(header.payload_len)
    if len(payload) < header.payload_len:
        raise CheckpointFileError("truncated")
    if f.read(1):
        raise CheckpointFileError("trailing bytes")
    if zlib.crc32(payload) != header.payload_crc:
        raise CheckpointFileError("checksum mismatch")
    return payload
