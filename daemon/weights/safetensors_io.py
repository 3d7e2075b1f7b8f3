"""The safetensors file format, read and written with numpy alone.

Layout: 8-byte little-endian header length, a JSON header mapping names to
{dtype, shape, data_offsets}, then the raw tensor bytes. Reading memory-maps the data
(zero copy, page cache shared across restarts); writing is deterministic (sorted names,
no timestamps) so a generated model directory is byte-identical for the same inputs.
"""

from __future__ import annotations

import json
import math
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import ggml_types

# safetensors dtype tag -> numpy dtype of the stored bytes. BF16 and the 8-bit float formats
# have no numpy dtype: they are carried as their raw bit patterns (uint16 / uint8) and widened by
# the kernel. I8 is how the official DeepSeek-V4 checkpoints store FP4 (e2m1) expert weights, two
# values per byte; F8_E8M0 is a power-of-two block scale, 2^(byte - 127).
DTYPES: dict[str, np.dtype] = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "F8_E4M3": np.dtype("u1"),
    "F8_E8M0": np.dtype("u1"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
}
MAX_HEADER_BYTES = 100 * 1024 * 1024


class SafetensorsError(ValueError):
    """A safetensors file that cannot be read; the message names the file."""


@dataclass(frozen=True)
class TensorInfo:
    file: Path
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offset of the data in the file
    end: int


def read_header(path: Path) -> tuple[bytes, dict[str, TensorInfo]]:
    """Parse a file's header; return its raw bytes (for fingerprints) and the tensor table."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise SafetensorsError(f"{path}: truncated safetensors file (no header length)")
            n = int.from_bytes(head, "little")
            if n <= 0 or n > MAX_HEADER_BYTES or 8 + n > size:
                raise SafetensorsError(
                    f"{path}: truncated or corrupt safetensors header (declares {n} bytes, file has {size})")
            raw = f.read(n)
    except OSError as e:
        raise SafetensorsError(f"{path}: cannot read: {e.strerror}") from None
    try:
        table = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: safetensors header is not valid JSON ({e})") from None
    if not isinstance(table, dict):
        raise SafetensorsError(f"{path}: safetensors header is not a JSON object")
    base = 8 + n
    infos: dict[str, TensorInfo] = {}
    for name, meta in table.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (a, b) = meta["dtype"], tuple(int(x) for x in meta["shape"]), meta["data_offsets"]
            if any(x < 0 for x in shape):
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise SafetensorsError(f"{path}: tensor {name!r} has a malformed header entry") from None
        if dtype not in DTYPES:
            raise SafetensorsError(
                f"{path}: tensor {name!r} has dtype {dtype}; supported: {', '.join(DTYPES)}")
        want = math.prod(shape) * DTYPES[dtype].itemsize   # math.prod: numpy's costs ~10 us a tensor
        if b - a != want or a < 0 or base + b > size:
            raise SafetensorsError(
                f"{path}: tensor {name!r} data is truncated or mis-sized "
                f"(offsets {a}..{b}, needs {want} bytes, file has {size - base} data bytes)")
        infos[name] = TensorInfo(path, name, dtype, shape, base + a, base + b)
    return raw, infos


class FileMaps:
    """One read-only memory map per weight file; tensors are numpy views of it (no bytes are read
    until used). A map per tensor would hold a file descriptor per tensor (mmap keeps a duplicate):
    V4-Flash's ~66,000 tensors would exceed any usual open-file limit (systemd's soft default is 1024).
    Here the descriptors are one per file, whatever the tensor count. A view keeps its file's map
    alive (numpy holds the mmap as the view's base); a map no view uses closes when this object goes."""

    def __init__(self) -> None:
        self._maps: dict[Path, mmap.mmap] = {}

    def _map(self, file: Path) -> mmap.mmap:
        m = self._maps.get(file)
        if m is None:
            with open(file, "rb") as f:   # the mapping keeps its own descriptor; this one closes now
                try:
                    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                except (OSError, ValueError) as e:
                    raise SafetensorsError(f"{file}: cannot map: {getattr(e, 'strerror', None) or e}") from None
            self._maps[file] = m
        return m

    def tensor(self, info: TensorInfo) -> np.ndarray:
        """The tensor's stored values; a GGUF block-quantized one (tag `GGML:<TYPE>`, logical shape
        [rows..., in]) as its bytes, uint8 [rows..., row_bytes] (ggml_types.py)."""
        if ggml_types.is_ggml(info.dtype):
            shape, dtype = ggml_types.stored_shape(info.dtype, info.shape), np.dtype("u1")
        else:
            shape, dtype = info.shape, DTYPES[info.dtype]
        count = math.prod(shape)
        if count == 0:
            return np.zeros(shape, dtype)
        m = self._map(info.file)
        if info.end > len(m):   # the file shrank since its header was read
            raise SafetensorsError(f"{info.file}: tensor {info.name!r} lies past the end of the file "
                                   f"({info.end} > {len(m)} bytes): was it rewritten while loading?")
        return np.frombuffer(m, dtype=dtype, count=count, offset=info.start).reshape(shape)

    def drop_resident(self) -> None:
        """Drop the maps' pages from this process's resident set (they stay in the page cache and fault
        back in if read again): after the kernel has packed its matrices, their source pages are not
        needed, though the small tensors it keeps in place pin each file's map."""
        for m in self._maps.values():
            if not m.closed:
                m.madvise(mmap.MADV_DONTNEED)


def map_tensor(info: TensorInfo) -> np.ndarray:
    """A read-only memory-mapped view of one tensor (its file mapped for it alone: for tests and
    tools; the loader maps each file once, FileMaps)."""
    return FileMaps().tensor(info)


def write_file(path: Path, tensors: dict[str, tuple[np.ndarray, str]]) -> None:
    """Write tensors (name -> (array, dtype tag)) deterministically, atomically."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    order = sorted(tensors)
    for name in order:
        arr, tag = tensors[name]
        nbytes = arr.size * DTYPES[tag].itemsize
        header[name] = {"dtype": tag, "shape": list(arr.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # keep the data 8-byte aligned, as the reference writer does
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for name in order:
            arr, tag = tensors[name]
            f.write(np.ascontiguousarray(arr, dtype=DTYPES[tag]).tobytes())
    os.replace(tmp, path)


def lazy_header(tensors: dict[str, tuple[tuple[int, ...], str, object]]) -> tuple[bytes, int]:
    """The JSON header (padded to 8 bytes) for tensors given as name -> (shape, dtype tag, _), in
    name order, and the data bytes that follow it."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in sorted(tensors):
        shape, tag, _ = tensors[name]
        nbytes = int(np.prod(shape, dtype=np.int64)) * DTYPES[tag].itemsize
        header[name] = {"dtype": tag, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8), offset


def write_file_lazy(path: Path, tensors: dict[str, tuple[tuple[int, ...], str, object]]) -> None:
    """write_file for tensors too large to hold together: name -> (shape, dtype tag, make), where
    make() returns the array or an iterable of row blocks; each is made only when it is written."""
    raw, _ = lazy_header(tensors)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for name in sorted(tensors):
            shape, tag, make = tensors[name]
            made = make()
            blocks = [made] if isinstance(made, np.ndarray) else made
            written = 0
            for block in blocks:
                block = np.ascontiguousarray(block, dtype=DTYPES[tag])
                f.write(block.tobytes())
                written += block.size
            if written != int(np.prod(shape, dtype=np.int64)):
                raise ValueError(f"{name}: made {written} values for shape {list(shape)}")
    os.replace(tmp, path)


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bit patterns, round to nearest even (what torch's .bfloat16() does)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))
    return (rounded >> 16).astype(np.uint16)
