"""bench/disk_probe.py reads what it says (O_DIRECT, aligned, each block once) and
bench/expert_paging.py's hit-rate curve replays the trace it is given through the kernel's policy."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import disk_probe  # noqa: E402
import expert_paging  # noqa: E402


def test_probe_reads_every_block_once_with_o_direct(tmp_path):
    f = tmp_path / "probe.bin"
    disk_probe.make_file(f, 8 << 20)
    for random in (False, True):
        r = disk_probe.measure(f, size=1 << 20, threads=2, random=random, seconds=30)
        assert r["bytes"] == 8 << 20 and r["exhausted"]          # 8 blocks, none twice, none skipped
        assert r["gb_s"] > 0 and r["size"] == 1 << 20 and r["threads"] == 2


def test_hit_curve_replays_the_trace_through_the_kernels_policy():
    from cairn import _kernel

    # 2 layers x 8 experts; calls cycle over 4 keys of layer 0 and 2 of layer 1, one per call
    rows = []
    for call in range(40):
        rows.append((call, 0, call % 4))
        rows.append((call, 1, 5 + call % 2))
    trace = np.asarray(rows, dtype=np.int32)
    curve = expert_paging.hit_curve(trace, 8, 16, [0.5, 1.0], ("lru",), _kernel, 1)
    # 8 slots hold all 6 keys: only the 6 first touches miss; 16 slots the same
    assert curve["lru"] == [1 - 6 / 80, 1 - 6 / 80]
    keys = trace[:, 1].astype(np.int64) * 8 + trace[:, 2]
    direct = _kernel.replay_expert_policy(keys, trace[:, 0].astype(np.int64), 8, "lru", k=1)
    assert direct["hits"] == 74
