"""Page files: pure encode / decode of one full page group on disk (no file-system effects here).

Design notes
 * ``pages/<key>.page`` where key is the hash of the token prefix the group closes
   (disk_format.page_key): stored once, shared by every checkpoint of that prefix. Immutable: a
   name that exists is never written again.
 * A 20-byte header (magic, version, payload length, CRC-32 of the payload) so a page file read
   on its own is checked; the checkpoint's header holds the same CRC, so a page file swapped for
   another valid one is caught too.

Layout (little-endian)::

    off  size  field
      0     8  magic        b"CAIRNPAG"
      8     4  version      u32 = 1
     12     4  payload_len  u32
     16     4  payload_crc  u32 = crc32(payload)
     20     P  payload      the kernel's page group bytes, opaque here
"""

from __future__ import annotations

import struct
import zlib

from .disk_format import CheckpointFileError

MAGIC = b"CAIRNPAG"
VERSION = 1
SUFFIX = ".page"
DIR = "pages"
_HEADER = struct.Struct("<8sIII")
HEADER_SIZE = _HEADER.size


def file_name(key: str) -> str:
    return key + SUFFIX


def file_size(page_nbytes: int) -> int:
    return HEADER_SIZE + page_nbytes


def encode_header(payload) -> bytes:
    """The header for ``payload``; write it followed by the payload."""
    view = memoryview(payload).cast("B")
    return _HEADER.pack(MAGIC, VERSION, len(view), zlib.crc32(view))


def decode(data, *, expect_len: int, expect_crc: int) -> memoryview:
    """The payload of a page file's bytes, checked against its own header and the checkpoint's
    expectation. Raises ``CheckpointFileError`` naming what is wrong."""
    view = memoryview(data).cast("B")
    if len(view) < HEADER_SIZE:
        raise CheckpointFileError("page file truncated")
    magic, version, n, crc = _HEADER.unpack_from(view, 0)
    if magic != MAGIC:
        raise CheckpointFileError("page file has a bad magic")
    if version != VERSION:
        raise CheckpointFileError(f"page file has version {version} (expected {VERSION})")
    if n != expect_len or len(view) != HEADER_SIZE + n:
        raise CheckpointFileError(f"page file has {len(view) - HEADER_SIZE} bytes, expected {expect_len}")
    payload = view[HEADER_SIZE:]
    if crc != expect_crc or zlib.crc32(payload) != crc:
        raise CheckpointFileError("page file checksum mismatch (damaged)")
    return payload
