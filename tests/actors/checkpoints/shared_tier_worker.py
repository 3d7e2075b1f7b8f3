"""One 'daemon' of the shared-tier stress test (test_shared_tier.py): run as a process.

    python shared_tier_worker.py DIR SEED ITERATIONS BUDGET

Each iteration writes one checkpoint of a small shared universe of prefixes (content derived from
the token ids, so both processes write identical files for the same name), runs an eviction pass,
and reads one file whole. Every fifth read is held open across an eviction pass that deletes
everything (budget 0), then finished. Prints counts as JSON. Deterministic per seed; the
interleaving with the other process is not, and the assertions hold for any interleaving.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from cairn.actors.checkpoints import disk_io, shared_dir
from cairn.actors.checkpoints.disk_format import CheckpointFileError, file_name, read_header, read_payload

UNIVERSE = 24


def tokens(k: int) -> np.ndarray:
    return np.random.default_rng(1000 + k).integers(0, 5000, size=64 + 8 * k).astype(np.int32)


def payload(t: np.ndarray) -> bytes:
    return np.random.default_rng(int(t.sum()) + len(t)).bytes(8_000 + 500 * (len(t) % 37))


def main(d: str, seed: int, iterations: int, budget: int) -> dict:
    rng = np.random.default_rng(seed)
    c = dict(reads_ok=0, misses=0, damaged=0, wrong_content=0, read_through_eviction=0, lost_mid_read=0)
    for i in range(iterations):
        t = tokens(int(rng.integers(UNIVERSE)))
        if not os.path.exists(os.path.join(d, file_name(t))):
            disk_io.write_checkpoint(d, "fp", "prompt_end", t, payload(t))
        shared_dir.evict_pass(d, budget)
        r = tokens(int(rng.integers(UNIVERSE)))
        try:
            f = open(os.path.join(d, file_name(r)), "rb")
        except FileNotFoundError:
            c["misses"] += 1                 # evicted (or never written): a miss, not an error
            continue
        with f:
            try:
                header = read_header(f, "fp")
                if i % 5 == 0:
                    before = os.path.exists(os.path.join(d, file_name(r)))
                    shared_dir.evict_pass(d, 0)          # delete everything while this file is open
                    c["read_through_eviction"] += before and not os.path.exists(os.path.join(d, file_name(r)))
                blob = read_payload(f, header)
            except CheckpointFileError:
                c["damaged"] += 1
                continue
            except OSError:
                c["lost_mid_read"] += 1
                continue
        if not np.array_equal(header.tokens, r) or blob != payload(r):
            c["wrong_content"] += 1
        else:
            c["reads_ok"] += 1
    return c


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))))
