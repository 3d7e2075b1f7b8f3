"""cairn against llama.cpp on the same GGUF files of a V4-Flash slice at real width (issue 23, a report, not a test).

    .venv/bin/python bench/gguf_slice.py [--llama-bin DIR] [--rounds 2] [--prompt 512] [--decode 32] FILE.gguf ...

Per file and round, one fresh process per engine, alternated A, B, A, B (the machine is shared and noisy);
before each pair the run waits for the 1-minute load average to drop below --quiet-load (polled every 30 s,
at most --wait-budget seconds over the whole run), and every JSON line records the load average and UTC
time at its start and end:
  cairn      load_model(FILE, threads) packing in memory (no packed_cache: its panels live in anonymous
             memory; the load, packing included, is timed apart), then a State: prefill of PROMPT seeded
             random ids (one chunk of the whole prompt, last-position logits) and DECODE decode steps fed
             fixed seeded ids (not its own argmax, so every round routes the same way). Reported: tok/s of
             each, VmRSS after the load and after the run, VmHWM, model.packed_bytes; the logits must be
             finite.
  llama.cpp  `llama-bench -m FILE -t THREADS -p PROMPT -n DECODE -r REPS -o json` under /usr/bin/time -v:
             pp at depth 0 and tg at depth 0 (its own random ids; mmap'd weights), then again with
             `-d PROMPT -p 0` for tg at depth PROMPT (cairn's decode runs after its prompt). Reported:
             its avg tok/s, its model_size, the process's maximum RSS (mapped file pages included).
The table printed at the end: the best round of each engine (max tok/s), with every round in the JSON lines.

The issue 23 run (docs/benchmarks/2026-12-01.md, "GGUF as stored: the flash slice (layers 2-3) in Q4_K and the q2 mix"):
    bench/gguf_quantize_slice.sh /work/gguf23        # the slice, its MXFP4 GGUF, the imatrix, Q4_K and the q2 mix
    .venv/bin/python bench/gguf_slice.py --llama-bin $LLAMA_SRC/build/bin --rounds 2 \
        /work/gguf23/flash23-q4k.gguf /work/gguf23/flash23-q2mix.gguf      (twice)
    .venv/bin/python bench/gguf_slice.py --llama-bin $LLAMA_SRC/build/bin --rounds 2 /work/gguf23/flash23-mxfp4.gguf
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_BIN = (Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "llama-peer"
               / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp" / "build" / "bin")


def status(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def cairn_one(path: str, threads: int, prompt_n: int, decode_n: int, seed: int) -> dict:
    """In a child process: one load and one prefill + decode of the same ids."""
    import numpy as np

    import cairn._kernel as K
    from cairn.daemon.weights.model_dir import load_model, open_model_dir

    md = open_model_dir(path)
    vocab = md.config["vocab_size"]
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, vocab, prompt_n).astype(np.int32)
    steps = rng.integers(0, vocab, decode_n).astype(np.int32)
    rss0, t = status("VmRSS"), time.perf_counter()
    model = load_model(md, threads=threads)
    load_s, rss_load = time.perf_counter() - t, status("VmRSS")
    st = K.State(model)
    K._profile(True)
    t = time.perf_counter()
    _, logits = K.prefill(st, prompt, chunk=prompt_n)
    prefill_s = time.perf_counter() - t
    prof_prefill = K._profile(True)
    finite = bool(np.isfinite(logits).all())
    t = time.perf_counter()
    for tok in steps:
        out = K.decode(st, int(tok))
    decode_s = time.perf_counter() - t
    prof_decode = K._profile(True)
    finite = finite and bool(np.isfinite(out).all())
    return {"engine": "cairn", "load_s": round(load_s, 1), "prefill_tok_s": prompt_n / prefill_s,
            "decode_tok_s": decode_n / decode_s, "rss_before_load": rss0, "rss_after_load": rss_load,
            "rss_after_run": status("VmRSS"), "rss_peak": status("VmHWM"), "packed_bytes": int(model.packed_bytes),
            "logits_finite": finite, "last_argmax": int(out.argmax()), "packed_from_cache": bool(model.packed_from_cache),
            # seconds per forward section (K._profile), largest first: where each phase's time goes
            "sections_prefill_s": top_sections(prof_prefill), "sections_decode_s": top_sections(prof_decode)}


def top_sections(prof: dict, n: int = 9) -> dict:
    return {k: round(v, 3) for k, v in sorted(prof.items(), key=lambda kv: -kv[1])[:n]}


def run_cairn(path: Path, a) -> dict:
    r = subprocess.run([sys.executable, __file__, "--cairn-one", str(path), "--threads", str(a.threads),
                        "--prompt", str(a.prompt), "--decode", str(a.decode), "--seed", str(a.seed)],
                       capture_output=True, text=True, errors="replace")
    if r.returncode != 0:
        raise SystemExit(f"cairn on {path.name} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def llama_bench(bin_dir: Path, path: Path, args: list[str]) -> tuple[list[dict], int]:
    cmd = ["/usr/bin/time", "-v", str(bin_dir / "llama-bench"), "-m", str(path), *args, "-o", "json"]
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    if r.returncode != 0:
        raise SystemExit(f"llama-bench on {path.name} failed:\n{(r.stdout + r.stderr)[-3000:]}")
    peak = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1)) * 1024
    return json.loads(r.stdout), peak


def run_llama(path: Path, a) -> dict:
    common = ["-t", str(a.threads), "-r", str(a.reps)]
    rows, peak = llama_bench(a.llama_bin, path, [*common, "-p", str(a.prompt), "-n", str(a.decode)])
    pp = next(x for x in rows if x["n_prompt"] > 0 and x["n_gen"] == 0)
    tg = next(x for x in rows if x["n_gen"] > 0)
    out = {"engine": "llama.cpp", "prefill_tok_s": pp["avg_ts"], "prefill_std": pp["stddev_ts"],
           "decode_d0_tok_s": tg["avg_ts"], "model_size": int(pp["model_size"]), "rss_peak": peak,
           "model_type": pp.get("model_type"), "flash_attn": pp.get("flash_attn"), "type_k": pp.get("type_k")}
    if a.depth_decode:
        rows, peak2 = llama_bench(a.llama_bin, path, [*common, "-p", "0", "-n", str(a.decode), "-d", str(a.prompt)])
        out["decode_tok_s"] = rows[0]["avg_ts"]
        out["rss_peak"] = max(peak, peak2)
    else:
        out["decode_tok_s"] = out["decode_d0_tok_s"]
    return out


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def wait_for_quiet(a, waited: list[float]) -> float:
    """Before a pair: poll the 1-minute load average every 30 s until it is below --quiet-load, within a
    total budget of --wait-budget seconds over the whole run (then run anyway). Returns the seconds waited."""
    t0 = time.monotonic()
    while (float(Path("/proc/loadavg").read_text().split()[0]) >= a.quiet_load
           and waited[0] + time.monotonic() - t0 < a.wait_budget):
        time.sleep(30)
    dt = time.monotonic() - t0
    waited[0] += dt
    return round(dt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--llama-bin", type=Path, default=DEFAULT_BIN, help="directory of llama-bench")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2, help="llama-bench -r")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-depth-decode", dest="depth_decode", action="store_false",
                    help="llama.cpp's decode at depth 0 only (skip the -d PROMPT run)")
    ap.add_argument("--quiet-load", type=float, default=1.0,
                    help="before each pair wait for the 1-minute load average to drop below this (default 1.0)")
    ap.add_argument("--wait-budget", type=float, default=2400,
                    help="total seconds of such waiting over the run, then run anyway (default 2400)")
    ap.add_argument("--cairn-one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.cairn_one:
        print(json.dumps(cairn_one(a.cairn_one, a.threads, a.prompt, a.decode, a.seed)))
        return
    cpu = next((ln.split(":", 1)[1].strip() for ln in subprocess.run(["lscpu"], capture_output=True, text=True)
                .stdout.splitlines() if ln.startswith("Model name")), "?")
    print(f"# cpu: {cpu}; {os.cpu_count()} cpus; threads {a.threads}; prompt {a.prompt}, decode {a.decode}; "
          f"load {loadavg()}", flush=True)
    best: dict[tuple[str, str], dict] = {}
    waited = [0.0]
    for rnd in range(a.rounds):
        for f in map(Path, a.files):
            wait_s = wait_for_quiet(a, waited)
            for engine, fn in (("cairn", run_cairn), ("llama.cpp", run_llama)):
                before, start = loadavg(), time.strftime("%H:%M:%S", time.gmtime())
                r = fn(f, a)
                r.update(file=f.name, round=rnd, stored_bytes=f.stat().st_size, load_before=before,
                         load_after=loadavg(), start_utc=start, end_utc=time.strftime("%H:%M:%S", time.gmtime()),
                         waited_s=wait_s)
                print(json.dumps(r), flush=True)
                key = (f.name, engine)
                for k in ("prefill_tok_s", "decode_tok_s"):
                    best.setdefault(key, {}).setdefault(k, 0.0)
                    best[key][k] = max(best[key][k], r[k])
                best[key]["last"] = r
                best[key].setdefault("load_s", []).append(r.get("load_s"))
    print(f"\n| file | stored GB | engine | prefill {a.prompt} tok/s | decode tok/s | resident GB | load s |")
    print("|---|---|---|---|---|---|---|")
    for (name, engine), b in best.items():
        r = b["last"]
        if engine == "cairn":
            res = (f"{r['rss_after_run'] / 1e9:.2f} (after load {r['rss_after_load'] / 1e9:.2f}, "
                   f"packed {r['packed_bytes'] / 1e9:.2f})")
            load = "–".join(f"{x}" for x in sorted(set(b["load_s"])))
        else:
            res = f"{r['rss_peak'] / 1e9:.2f} peak (model_size {r['model_size'] / 1e9:.2f})"
            load = "mmap"
        print(f"| {name} | {r['stored_bytes'] / 1e9:.2f} | {engine} | {b['prefill_tok_s']:.2f} | "
              f"{b['decode_tok_s']:.2f} | {res} | {load} |")


if __name__ == "__main__":
    main()
