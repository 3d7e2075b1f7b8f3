"""The flash slice under a memory cap, side by side (issue 24, item 1): cairn on the official format
with routed experts paged from disk, against llama.cpp's llama-server on the GGUF of the same
weights with its weights mmap'd, each inside a cgroup v1 memory group capped at a share of the
slice's stored bytes. As root:

    .venv/bin/python bench/cgroup_side_by_side.py /work/bench-flash23 \\
        /work/gguf23/flash23-mxfp4.gguf --packed /work/cgroup-packed \\
        --llama-bin /work/llama-peer/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin \\
        --caps 0.25,0.5 --prompt 256 --decode 16 --rounds 2 --threads 2 --json /tmp/side_by_side.json

Steps:
 * the packed cache file is written (if missing) by one resident bench/paged_worker.py run outside
   any cap (bench/expert_paging.worker), which also gives the dense and expert bytes; a `--nothing`
   run gives the process's baseline;
 * bench/disk_probe.py's O_DIRECT probe (12.75 MiB and 1 MiB reads, random at 1/2/4 threads) in the
   packed cache's directory;
 * per round and cap (cap = share x the bytes of every file in the model directory), alternating
   the engines' order between rounds, each run in a fresh group (bench/cgroup_v1.run_limited) after
   `echo 3 > /proc/sys/vm/drop_caches` (cold page cache):
     - cairn: bench/paged_worker.py (run in-process by this script's `--cairn-child` mode, which
       wraps `_kernel.prefill` / `_kernel.decode` to snapshot /proc/self/io read_bytes around them)
       with expert_cache_bytes = cap - (baseline + dense + state) - --margin-gb, whole slots;
     - llama.cpp: `--llama-child` starts llama-server (bench/llama_peer.LlamaServer: ubatch = chunk,
       f32 KV, no prompt cache; mmap, the default load mode) with LLAMA_ARG_REPACK=0 (the CPU
       backend's repack would copy the experts to anonymous memory, beyond any cap here) and streams
       one /completion of the same prompt ids, greedy, exactly --decode + 1 tokens; the server's
       /proc/<pid>/io read_bytes is read after load, at the first token and at the end.
 * per run: prefill and decode tok/s, bytes read from disk per prefill and per decode token, the
   disk-bound decode rate = probe bandwidth (best random 12.75 MiB) / bytes read per decode token and
   the engine's decode as a share of it, the group's peak usage, failcnt and OOM kills.
Decode tokens are each engine's own greedy choice (the prompt ids are the same on both).
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cgroup_v1  # noqa: E402
from expert_paging import WORKER, agent_stream, worker  # noqa: E402
from paged_worker import vm_hwm  # noqa: E402


def read_bytes(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/io") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("read_bytes:"))


def loadavg() -> list[str]:
    return Path("/proc/loadavg").read_text().split()[:3]


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


# --- the children, run inside the group -------------------------------------------------------

def cairn_child(worker_argv: list[str]) -> None:
    """bench/paged_worker.py in this process, with read_bytes snapshots around prefill and decode."""
    from cairn import _kernel

    marks: dict = {"prefill": [], "decode": []}
    for name in ("prefill", "decode"):
        fn = getattr(_kernel, name)

        def wrapped(*a, _fn=fn, _name=name, **k):
            before = read_bytes()
            out = _fn(*a, **k)
            marks[_name].append((before, read_bytes()))
            return out
        setattr(_kernel, name, wrapped)
    sys.argv = [str(WORKER), *worker_argv]
    runpy.run_path(str(WORKER), run_name="__main__")   # prints the worker's JSON line
    pre, dec = marks["prefill"], marks["decode"]
    print(json.dumps({"io": {"prefill_read_bytes": pre[-1][1] - pre[0][0] if pre else 0,
                             "decode_read_bytes": dec[-1][1] - dec[0][0] if dec else 0,
                             "total_read_bytes": read_bytes()}}), flush=True)


def llama_child(a) -> None:
    """llama-server on the GGUF (mmap, no repack), one streamed greedy completion of the prompt ids."""
    from llama_peer import LlamaServer, sse_event_times
    import socket

    if not a.llama_repack:
        os.environ["LLAMA_ARG_REPACK"] = "0"
    ids = [int(x) for x in np.load(a.prompt_file)]
    src = Path(a.llama_bin).resolve().parent.parent        # LlamaServer wants <src>/build/bin
    t0 = time.perf_counter()
    srv = LlamaServer(src, Path(a.gguf), a.threads, a.chunk, a.ctx, a.log)
    load_s = time.perf_counter() - t0
    pid = srv.proc.pid
    try:
        rb_load = read_bytes(pid)
        events: list = []

        def on_event(block: bytes) -> bool:
            events.append((time.perf_counter(), read_bytes(pid), block))
            return b'"stop":false' in block
        body = {"prompt": ids, "n_predict": a.decode + 1, "temperature": 0.0, "ignore_eos": True,
                "cache_prompt": False, "stream": True}
        t_req = time.perf_counter()
        tok_times = sse_event_times(socket.create_connection(("127.0.0.1", srv.port)), "/completion", "127.0.0.1",
                                    body, on_event)
        rb_end = read_bytes(pid)
        hwm = vm_hwm(pid)
    finally:
        srv.close()
    final = json.loads(events[-1][2].split(b"data:", 1)[1])
    t = final["timings"]
    tokens = [json.loads(e[2].split(b"data:", 1)[1]).get("tokens") for e in events[:-1]]
    first = next(e for e in events if b'"stop":false' in e[2])
    print(json.dumps({
        "load_s": load_s, "prompt_n": t["prompt_n"], "predicted_n": t["predicted_n"],
        "prompt_ms": t["prompt_ms"], "predicted_ms": t["predicted_ms"],
        "n_token_events": len(tok_times),
        "decode_tok_s_events": (len(tok_times) - 1) / (tok_times[-1] - tok_times[0]) if len(tok_times) > 1 else None, "wall_first_token_s": first[0] - t_req,
        "io": {"load_read_bytes": rb_load, "prefill_read_bytes": first[1] - rb_load,
               "decode_read_bytes": rb_end - first[1], "total_read_bytes": rb_end},
        "server_vm_hwm": hwm, "tokens": tokens,
    }), flush=True)


# --- the parent -------------------------------------------------------------------------------

def last_json(stdout: str, key: str) -> dict:
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{") and key in line:
            return json.loads(line)
    return {}


def group_fields(run: cgroup_v1.CgroupRun) -> dict:
    return {"returncode": run.returncode, "cap_bytes": run.limit_bytes, "max_usage_bytes": run.max_usage_bytes,
            "failcnt": run.failcnt, "oom_kills": run.oom_kills,
            "stderr_tail": run.stderr[-1500:] if run.returncode else ""}


def run_cairn(a, prompt: Path, cap: int, budget: int, name: str = "cairn") -> dict:
    extra = [x for x in a.cairn_arms.get(name, "").split(":") if x]
    cmd = [sys.executable, str(Path(__file__).resolve()), "--cairn-child", "--",
           str(a.model), str(a.packed), "--prompt-file", str(prompt), "--decode", str(a.decode),
           "--threads", str(a.threads), "--chunk", str(a.chunk), "--budget", str(budget), *extra]
    t0 = time.time()
    try:
        run = cgroup_v1.run_limited(cmd, cap, name="sbs-cairn", timeout=a.timeout)
    except subprocess.TimeoutExpired:
        return {"engine": name, "timeout_s": a.timeout, "wall_s": time.time() - t0}
    row = {"engine": name, "budget_bytes": budget, "wall_s": time.time() - t0, **group_fields(run)}
    out, io = last_json(run.stdout, '"digest"'), last_json(run.stdout, '"io"').get("io", {})
    if out:
        row |= {"prefill_tok_s": out["prefill_tokens"] / out["prefill_s"], "decode_tok_s": out["decode_tokens"] / out["decode_s"],
                "prefill_read_per_token": io.get("prefill_read_bytes", 0) / out["prefill_tokens"],
                "decode_read_per_token": io.get("decode_read_bytes", 0) / out["decode_tokens"],
                "pager_decode_bytes_per_token": out["decode_stats"].get("bytes_read", 0) / out["decode_tokens"],
                "pager_prefill_bytes_per_token": out["prefill_stats"].get("bytes_read", 0) / out["prefill_tokens"],
                "decode_hit_rate": out["decode_stats"]["hits"] / max(1, out["decode_stats"]["hits"] + out["decode_stats"]["misses"]),
                "slots": out["info"].get("slots"), "direct_io": out["info"].get("direct_io"),
                "vm_hwm": out["vm_hwm"], "load_s": out["load_s"], "tokens": out["tokens"], "digest": out["digest"], "io": io}
    return row


def run_llama(a, prompt: Path, cap: int, log: Path) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--llama-child", "-", str(a.gguf),
           "--llama-bin", str(a.llama_bin), "--prompt-file", str(prompt), "--decode", str(a.decode),
           "--threads", str(a.threads), "--chunk", str(a.chunk), "--ctx", str(a.ctx), "--log", str(log),
           *(["--llama-repack"] if a.llama_repack else [])]
    t0 = time.time()
    try:
        run = cgroup_v1.run_limited(cmd, cap, name="sbs-llama", timeout=a.timeout)
    except subprocess.TimeoutExpired:
        return {"engine": "llama.cpp", "timeout_s": a.timeout, "wall_s": time.time() - t0,
                "note": f"no result within {a.timeout} s (a lower bound on its time)"}
    row = {"engine": "llama.cpp" + (" (repack)" if a.llama_repack else ""), "wall_s": time.time() - t0, **group_fields(run)}
    out = last_json(run.stdout, '"prompt_ms"')
    if out:
        io = out["io"]
        row |= {"prefill_tok_s": out["prompt_n"] / (out["prompt_ms"] / 1e3),
                "decode_tok_s": out["predicted_n"] / (out["predicted_ms"] / 1e3),   # the server's own rate
                "decode_tok_s_events": out["decode_tok_s_events"],
                "prefill_read_per_token": io["prefill_read_bytes"] / out["prompt_n"],
                "decode_read_per_token": io["decode_read_bytes"] / max(1, out["predicted_n"] - 1),
                "same_prompt_n": out["prompt_n"] == a.prompt, "predicted_n": out["predicted_n"],
                "vm_hwm": out["server_vm_hwm"], "load_s": out["load_s"], "io": io, "tokens": out["tokens"]}
    return row


def main() -> None:
    if "--cairn-child" in sys.argv:
        cairn_child(sys.argv[sys.argv.index("--") + 1:])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path, nargs="?")
    ap.add_argument("gguf", type=Path, nargs="?")
    ap.add_argument("--packed", type=Path, default=Path("/work/cgroup-packed"))
    ap.add_argument("--llama-bin", type=Path,
                    default=Path("/work/llama-peer/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin"))
    ap.add_argument("--caps", default="0.25,0.5", help="caps as shares of the model directory's stored bytes")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--margin-gb", type=float, default=0.15, help="left free under the cap beyond baseline+dense+state")
    ap.add_argument("--timeout", type=float, default=600, help="per run (s); a run past it is recorded as a lower bound")
    ap.add_argument("--probe-seconds", type=float, default=3)
    ap.add_argument("--engines", default="cairn,llama.cpp",
                    help="in run order; a name starting with 'cairn' runs bench/paged_worker.py with its --cairn-arm")
    ap.add_argument("--cairn-arm", action="append", default=[], metavar="NAME=ARG[:ARG...]",
                    help="extra paged_worker arguments for the engine NAME, e.g. cairn_old=--prefetch=off:--policy=hotpin")
    ap.add_argument("--json", type=Path, default=None)
    # the children's arguments
    ap.add_argument("--llama-repack", action="store_true",
                    help="leave llama.cpp's CPU weight repacking on (its default; copies the experts to anonymous memory)")
    ap.add_argument("--llama-child", action="store_true")
    ap.add_argument("--prompt-file", default=None)
    ap.add_argument("--log", default="/tmp/sbs-llama-server.log")
    a = ap.parse_args()
    a.cairn_arms = dict(spec.split("=", 1) for spec in a.cairn_arm)
    if a.llama_child:
        llama_child(a)
        return

    from disk_probe import probe

    res: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "loadavg_start": loadavg(),
                 "args": {k: str(v) for k, v in vars(a).items()}, "rows": []}
    stored = sum(p.stat().st_size for p in a.model.iterdir() if p.is_file())
    res["stored_bytes"] = stored
    res["gguf_bytes"] = a.gguf.stat().st_size
    a.packed.mkdir(parents=True, exist_ok=True)
    prompt = a.packed / f"sbs-prompt-{a.prompt}.npy"
    np.save(prompt, agent_stream(a.model, a.prompt))
    # outside any cap: the packed cache file (written once), its sizes, the process baseline
    t0 = time.time()
    info = worker(a.model, a.packed, prompt, "--decode", 0, "--budget", 1 << 50, "--threads", a.threads)["info"]
    res["pack_or_check_s"] = time.time() - t0
    base = worker(a.model, a.packed, prompt, "--nothing")["vm_hwm"]
    res |= {"info": info, "baseline_vm_hwm": base}
    print(f"stored {stored / 1e9:.3f} GB; packed dense {info['dense_bytes'] / 1e9:.3f} GB + experts "
          f"{info['expert_bytes_total'] / 1e9:.3f} GB ({info['experts_total']} x {info['slot_bytes'] / 2**20:.2f} MiB); "
          f"baseline {base / 1e9:.3f} GB", flush=True)
    pr = probe(a.packed, file_gib=6, seconds=a.probe_seconds, keep=False)
    res["probe"] = pr
    bw = pr["random_expert_gb_s"] * 1e9
    print(f"probe: sequential {pr['sequential_gb_s']} GB/s, random 12.75 MiB {pr['random_expert_gb_s']} GB/s, "
          f"random 1 MiB {pr['random_1mib_gb_s']} GB/s (load {' '.join(pr['loadavg'])})", flush=True)
    caps = [float(s) for s in a.caps.split(",")]
    engines = a.engines.split(",")
    state = 1 << 20
    for rnd in range(a.rounds):
        for share in caps:
            cap = int(stored * share)
            budget = cap - base - info["dense_bytes"] - state - int(a.margin_gb * 1e9)
            budget = budget // info["slot_bytes"] * info["slot_bytes"]
            order = engines if rnd % 2 == 0 else engines[::-1]
            for eng in order:
                drop_caches()
                la0 = loadavg()
                utc = time.strftime("%H:%M:%S", time.gmtime())
                if eng.startswith("cairn"):
                    if budget < info["slot_bytes"]:
                        row = {"engine": eng, "note": "dense + baseline + state exceed the cap"}
                    else:
                        row = run_cairn(a, prompt, cap, budget, eng)
                else:
                    row = run_llama(a, prompt, cap, Path(f"/tmp/sbs-llama-{rnd}-{share}.log"))
                row |= {"round": rnd, "share": share, "cap_bytes": cap, "utc": utc, "loadavg_start": la0,
                        "loadavg_end": loadavg()}
                if row.get("decode_read_per_token"):
                    row["disk_bound_tok_s"] = bw / row["decode_read_per_token"]
                    row["of_disk_bound"] = row["decode_tok_s"] / row["disk_bound_tok_s"]
                res["rows"].append(row)
                print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()
                                  if k not in ("tokens", "digest", "stderr_tail")}), flush=True)
                if row.get("stderr_tail"):
                    print(row["stderr_tail"], file=sys.stderr)
                if a.json:
                    a.json.write_text(json.dumps(res, indent=2))
    res["loadavg_end"] = loadavg()
    print(f"{'cap':>4} {'engine':<10} {'prefill':>8} {'decode':>7} {'MB/dec tok':>10} {'disk-bound':>10} {'share':>6}")
    for r in res["rows"]:
        if "decode_tok_s" in r:
            print(f"{int(100 * r['share']):>3}% {r['engine']:<10} {r['prefill_tok_s']:>8.2f} {r['decode_tok_s']:>7.2f} "
                  f"{r['decode_read_per_token'] / 1e6:>10.1f} {r.get('disk_bound_tok_s', float('nan')):>10.2f} "
                  f"{r.get('of_disk_bound', float('nan')):>6.2f}")
        else:
            print(f"{int(100 * r['share']):>3}% {r['engine']:<10} {r.get('note') or r.get('stderr_tail', '')[-200:]}")
    if a.json:
        a.json.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
