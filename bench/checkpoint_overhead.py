"""Prefix checkpoints, measured on the kernel directly (no daemon): what a capture adds to a prefill,
and what a restore costs against the snapshot size.

    python bench/checkpoint_overhead.py models/small [--tokens 8192] [--repeat 3] [--json out.json]

Capture overhead: the same prompt prefilled the way the prefill worker does it (kernel calls from
`plan.pieces`), once without capture points and once with the two usual ones — a system-prefix
cut at ~half the prompt plus the prompt end — snapshotting at each (`state.snapshot()`, which copies
the tail and shares the page groups). Restore: `State.restore(model, snap)` for prefixes of growing
length, and the disk tier: the snapshot's one-blob form (`to_bytes`) in a checkpoint file, read back
through `disk_io.load` and rebuilt with `Snapshot.from_bytes`. Best of `--repeat` runs. Pages against
full copies, per turn: bench/checkpoint_pages.py.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--segment", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()

    from cairn import _kernel as K
    from cairn.actors.checkpoints import disk_format, disk_io
    from cairn.actors.checkpoints.plan import pieces
    from cairn.daemon.weights.model_dir import load_model, open_model_dir

    model = load_model(open_model_dir(args.model), args.threads)
    vocab = int(model.vocab_size)
    toks = np.random.default_rng(0).integers(100, vocab, size=args.tokens).astype(np.int32)
    cut = (args.tokens // 2) // 100 * 100 + 37       # a system boundary off the chunk grid

    def run(cuts: list[int], end_capture: bool) -> tuple[float, float, list]:
        st = K.State(model)
        snaps, snap_s = [], 0.0
        t0 = time.perf_counter()
        for a, b in pieces(0, args.tokens, args.segment, cuts):
            K.prefill(st, toks[a:b], chunk=args.chunk)
            if b in cuts:
                t = time.perf_counter()
                snaps.append(st.snapshot())
                snap_s += time.perf_counter() - t
        if end_capture:
            t = time.perf_counter()
            snaps.append(st.snapshot())
            snap_s += time.perf_counter() - t
        return time.perf_counter() - t0, snap_s, snaps

    run([], False)                                    # warm-up (page in the weights)
    plains, captured = [], []
    for _ in range(args.repeat):                      # interleaved, so a busy minute hits both alike
        plains.append(run([], False)[0])
        captured.append(run([cut], True))
    plain = min(plains)
    best = min(captured, key=lambda r: r[0])
    print(f"prefill {args.tokens} tokens, chunk {args.chunk}, {args.threads} threads", flush=True)
    print(f"  runs without / with captures (s): {[round(x, 2) for x in plains]} / "
          f"{[round(r[0], 2) for r in captured]}")
    print(f"  no captures:                          {plain:8.3f} s")
    print(f"  system cut at {cut} + prompt end:     {best[0]:8.3f} s   "
          f"(+{(best[0] - plain) * 1000:.0f} ms, {100 * (best[0] - plain) / plain:+.1f} %; "
          f"of which snapshots {best[1] * 1000:.1f} ms copying {sum(s.copied_nbytes for s in best[2]) / 1e6:.2f} MB, "
          f"referencing {sum(s.nbytes for s in best[2]) / 1e6:.2f} MB)")

    rows = []
    tmpdir = Path(tempfile.mkdtemp(prefix="cairn-ckpt-bench-"))
    fp = model.fingerprint + ";bench"
    st = K.State(model)
    done = 0
    for n in (512, 1024, 2048, 4096, 8192, 16384):
        if n > args.tokens * 2:
            break
        more = np.random.default_rng(n).integers(100, vocab, size=n - done).astype(np.int32)
        K.prefill(st, more, chunk=args.chunk)
        done = n
        snap = min(_timed(st.snapshot) for _ in range(args.repeat))
        snapshot = st.snapshot()
        restore = min(_timed(lambda: K.State.restore(model, snapshot)) for _ in range(args.repeat))
        # Disk tier: a checkpoint file read back and restored (disk_io.load verifies header and
        # checksums), against plainly reading the same file's bytes. Page cache warm for both.
        blob = snapshot.to_bytes()
        path = disk_io.atomic_write(tmpdir, "bench.ckpt", [disk_format.encode_header(fp, "system", st.tokens, blob), blob])
        read = min(_timed(lambda: path.read_bytes()) for _ in range(args.repeat))
        disk = min(_timed(lambda: K.State.restore(model, K.Snapshot.from_bytes(model, disk_io.load(path, fp)[1])))
                   for _ in range(args.repeat))
        rows.append({"tokens": n, "bytes": len(blob), "copied_bytes": snapshot.copied_nbytes,
                     "snapshot_ms": snap * 1000, "restore_ms": restore * 1000,
                     "file_read_ms": read * 1000, "disk_restore_ms": disk * 1000})
    sys.stdout.flush()
    shutil.rmtree(tmpdir, ignore_errors=True)
    # "blob MB" is the snapshot's serialized size (what one checkpoint file holds), "copied MB" what
    # taking it copied (the tail: the page groups are shared, so an in-memory restore moves no rows)
    print(f"{'tokens':>7} {'blob MB':>8} {'copied MB':>10} {'snapshot ms':>12} {'restore ms':>11} "
          f"{'file read ms':>13} {'disk restore ms':>16} {'disk/read':>10}")
    for r in rows:
        print(f"{r['tokens']:>7} {r['bytes'] / 1e6:8.2f} {r['copied_bytes'] / 1e6:10.2f} {r['snapshot_ms']:12.1f} "
              f"{r['restore_ms']:11.2f} {r['file_read_ms']:13.1f} "
              f"{r['disk_restore_ms']:16.1f} {r['disk_restore_ms'] / max(r['file_read_ms'], 1e-9):9.1f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"plain_s": plain, "captured_s": best[0], "snapshots_s": best[1],
                                               "cut": cut, "restore": rows}, indent=2))
    return 0


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


if __name__ == "__main__":
    sys.exit(main())
