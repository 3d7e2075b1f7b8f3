"""The disk's read bandwidth as the expert pager sees it: O_DIRECT (no page cache), aligned reads
of one routed expert of V4-Flash (12.75 MiB: three FP4 2048x4096 matrices and their ue8m0 scales)
and of 1 MiB, sequential and at random offsets, from 1 to 4 threads.

    .venv/bin/python bench/disk_probe.py [--dir /tmp] [--file-gib 6] [--seconds 4] [--json out.json]

The probe file is written once (kept between runs with --keep) and is larger than the random read
set, so a read never repeats an earlier one's bytes and no cache of the host or device can answer
it twice. Each measurement reads for `--seconds` per configuration; a figure is bytes / wall time.
This is the number bench/expert_paging.py compares the pager's achieved read bandwidth with.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import threading
import time
from pathlib import Path

import numpy as np

MIB = 1 << 20
EXPERT_BYTES = 12 * MIB + 768 * 1024        # 12.75 MiB, 4 KiB aligned
ALIGN = 4096


def make_file(path: Path, size: int) -> None:
    """A file of `size` random-ish bytes (incompressible: a fresh block per 64 MiB), fsynced."""
    if path.exists() and path.stat().st_size >= size:
        return
    block = np.random.default_rng(0).integers(0, 256, 64 * MIB, dtype=np.uint8)
    with open(path, "wb") as fh:
        written = 0
        while written < size:
            block[:8] = np.frombuffer(written.to_bytes(8, "little"), dtype=np.uint8)
            n = min(len(block), size - written)
            fh.write(block[:n].tobytes())
            written += n
        fh.flush()
        os.fsync(fh.fileno())


def _reader(path: Path, offsets, size: int, deadline: float, out: list, lock: threading.Lock) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, size)                 # page-aligned, as O_DIRECT needs
    done = 0
    try:
        for off in offsets:
            if time.perf_counter() >= deadline:
                break
            n = os.preadv(fd, [buf], off)
            if n <= 0:
                break
            done += n
    finally:
        os.close(fd)
        buf.close()
    with lock:
        out.append(done)


def measure(path: Path, *, size: int, threads: int, random: bool, seconds: float, seed: int = 0) -> dict:
    """Bytes/s of `threads` readers for `seconds`: sequential (each thread its own contiguous
    stretch) or at random aligned offsets (no offset twice)."""
    file_size = path.stat().st_size
    n_blocks = file_size // size
    if random:
        order = np.random.default_rng(seed).permutation(n_blocks)
    else:
        order = np.arange(n_blocks)
    parts = np.array_split(order, threads)
    out: list = []
    lock = threading.Lock()
    t0 = time.perf_counter()
    deadline = t0 + seconds
    ts = [threading.Thread(target=_reader, args=(path, [int(b) * size for b in part], size, deadline, out, lock))
          for part in parts]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    total = sum(out)
    return {"read": "random" if random else "sequential", "size": size, "threads": threads,
            "bytes": total, "seconds": round(wall, 3), "gb_s": round(total / wall / 1e9, 3),
            "exhausted": total >= n_blocks * size}


def probe(directory: str | Path = "/tmp", file_gib: float = 6, seconds: float = 4, keep: bool = False,
          threads=(1, 2, 4)) -> dict:
    path = Path(directory) / "cairn-disk-probe.bin"
    size = int(file_gib * (1 << 30)) // EXPERT_BYTES * EXPERT_BYTES
    make_file(path, size)
    rows = []
    try:
        for block in (EXPERT_BYTES, MIB):
            rows.append(measure(path, size=block, threads=1, random=False, seconds=seconds))
            for t in threads:
                rows.append(measure(path, size=block, threads=t, random=True, seconds=seconds, seed=t))
    finally:
        if not keep:
            path.unlink(missing_ok=True)
    best = {k: max(r["gb_s"] for r in rows if r["read"] == "random" and r["size"] == s)
            for k, s in (("random_expert_gb_s", EXPERT_BYTES), ("random_1mib_gb_s", MIB))}
    seq = max(r["gb_s"] for r in rows if r["read"] == "sequential")
    return {"file": str(path), "file_bytes": size, "loadavg": open("/proc/loadavg").read().split()[:3],
            "rows": rows, "sequential_gb_s": seq, **best}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp", help="where to put the probe file (the disk of the packed cache)")
    ap.add_argument("--file-gib", type=float, default=6.0)
    ap.add_argument("--seconds", type=float, default=4.0, help="per configuration")
    ap.add_argument("--keep", action="store_true", help="keep the probe file for the next run")
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args()
    res = probe(a.dir, a.file_gib, a.seconds, a.keep)
    print(f"loadavg {' '.join(res['loadavg'])}; file {res['file_bytes'] / (1 << 30):.2f} GiB, O_DIRECT")
    print(f"{'read':<11} {'size':>10} {'threads':>7} {'GB/s':>7} {'GB read':>8}")
    for r in res["rows"]:
        print(f"{r['read']:<11} {r['size'] / MIB:>7.2f}MiB {r['threads']:>7} {r['gb_s']:>7.3f} "
              f"{r['bytes'] / 1e9:>8.2f}{'  (file exhausted: larger --file-gib)' if r['exhausted'] else ''}")
    print(f"best: sequential {res['sequential_gb_s']} GB/s, random 12.75 MiB {res['random_expert_gb_s']} GB/s, "
          f"random 1 MiB {res['random_1mib_gb_s']} GB/s")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
