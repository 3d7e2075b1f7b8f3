"""Daemon start-up at the real checkpoint's tensor count (issue 20): `cairn serve` from spawn to ready.

    python bench/startup.py MODEL_DIR [--rounds 3] [--threads 2] [--nofile 256] [--paged 16M] [--json out.json]

For each mode, `--rounds` times: a cold start (an empty state directory: every shard hashed for the
fingerprint; an empty packed-cache directory) then a warm one (the digest cache and, when written, the
packed cache from the cold start). Modes: `resident` (every expert in memory; a model this small is not
packed to disk) and, with `--paged SIZE`, `paged` (`--expert-cache SIZE`: the packed panels are written
to the packed cache cold and mapped from it warm). Time to ready = spawn to READY=1 on a NOTIFY_SOCKET
(sent once the socket accepts), phases from the daemon's log (`model_weights_hashed`, `model_loaded`),
peak RSS = the child's ru_maxrss (os.wait4). The child runs with RLIMIT_NOFILE soft = `--nofile`.
The files are in the page cache throughout (nothing here drops it: the machine is shared), so "cold"
means cairn's caches are empty, not the disk's. Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def start_once(model: Path, state: Path, packed: Path, threads: int, nofile: int, extra: list[str]) -> dict:
    work = Path(tempfile.mkdtemp(prefix="cairn-startup-"))
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(work / "notify.sock"))
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    env = {**os.environ, "NOTIFY_SOCKET": str(work / "notify.sock")}
    cmd = [sys.executable, "-m", "cairn.daemon.cli.main", "serve", "--slots", "1", "--threads", str(threads),
           "--model", str(model), "--socket", str(work / "api.sock"), "--checkpoint-dir", str(state),
           "--packed-cache-dir", str(packed), *extra]
    log = open(work / "serve.log", "w")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard)))
    try:
        notify.settimeout(0.2)
        while True:
            try:
                if notify.recv(4096) == b"READY=1":
                    break
            except TimeoutError:
                if proc.poll() is not None or time.monotonic() - t0 > 300:
                    log.flush()
                    tail = (work / "serve.log").read_text()[-1500:]
                    raise SystemExit(f"cairn serve did not get ready (exit {proc.poll()}):\n{tail}")
        ready = time.monotonic() - t0
        proc.terminate()
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        notify.close()
        log.close()
    events = {}
    for line in (work / "serve.log").read_text().splitlines():
        if line.startswith("{"):
            e = json.loads(line)
            events[e.get("event")] = e
    shutil.rmtree(work)
    loaded = events.get("model_loaded", {})
    return {"ready_s": round(ready, 3), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
            "hash_s": events.get("model_weights_hashed", {}).get("seconds", 0.0),
            "kernel_load_s": loaded.get("seconds"), "packed_from_cache": loaded.get("packed_from_cache"),
            "packed_cache_written": loaded.get("packed_cache_written"), "exit": os.waitstatus_to_exitcode(status)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--nofile", type=int, default=256)
    ap.add_argument("--paged", default=None, help="also a paged mode with this --expert-cache size")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    modes = [("resident", ["--expert-cache", "all"])] + ([("paged", ["--expert-cache", a.paged])] if a.paged else [])
    rows: dict[str, list[dict]] = {}
    for _ in range(a.rounds):
        for mode, extra in modes:
            root = Path(tempfile.mkdtemp(prefix="cairn-startup-caches-"))
            for kind in ("cold", "warm"):
                r = start_once(a.model, root / "state", root / "packed", a.threads, a.nofile, extra)
                rows.setdefault(f"{mode} {kind}", []).append(r)
                print(mode, kind, json.dumps(r), flush=True)
            shutil.rmtree(root)
    summary = {k: {"ready_s_median": statistics.median(r["ready_s"] for r in v),
                   "peak_rss_mb_median": statistics.median(r["peak_rss_mb"] for r in v),
                   "hash_s_median": statistics.median(r["hash_s"] for r in v),
                   "kernel_load_s_median": statistics.median(r["kernel_load_s"] for r in v)}
               for k, v in rows.items()}
    print(json.dumps(summary, indent=1))
    if a.json:
        a.json.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
