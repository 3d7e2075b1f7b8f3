"""Paged experts before/after a kernel change, alternating in one run (issue 12: keep the disk busy).

    .venv/bin/python bench/paging_ab.py /tmp/flash2 /tmp/flash2-packed \\
        --arm before=/work/main/.venv/bin/python:/work/main/bench/paged_worker.py \\
        --arm after4=.venv/bin/python:bench/paged_worker.py:--readers=4 \\
        --arm after2=.venv/bin/python:bench/paged_worker.py:--readers=2 \\
        --shares 0.25,0.5 --rounds 2 --prompt 256 --decode 8 --json /tmp/ab.json

An arm is LABEL=PYTHON:WORKER[:EXTRA_ARG...]: the interpreter (its venv's kernel) and the
bench/paged_worker.py it runs, so a checkout's kernel is measured with its own worker. Each round
(after one untimed resident run that brings the packed file's dense part into the page cache) runs
the disk probe (bench/disk_probe.py, O_DIRECT 12.75 MiB random reads at 1/2/4 threads), then
for every arm in turn a resident run and a paged run per share (a fresh process each: cold slot
pool), so every arm sees the same disk and load within a few minutes. Reported per run: prefill and
decode tok/s, the cold prefill's read bandwidth (bytes read / prefill wall time) and its share of
the round's probe, stall / prefill time; the logits digest of every run is checked against the
first resident run's (bit-identity across arms and budgets).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def run_arm(arm: tuple[str, str, list[str]], model: str, packed: str, prompt: str, budget: int, decode: int,
            chunk: int = 128) -> dict:
    py, worker, extra = arm
    cmd = [py, worker, model, packed, "--prompt-file", prompt, "--decode", str(decode), "--budget", str(budget),
           "--chunk", str(chunk), *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("packed", help="packed cache directory (written by the first run when missing)")
    ap.add_argument("--arm", action="append", required=True, help="LABEL=PYTHON:WORKER[:EXTRA...]")
    ap.add_argument("--shares", default="0.25,0.5", help="paged budgets as shares of the routed experts' bytes")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=256, help="agent-stream prefill tokens (chunk 128)")
    ap.add_argument("--decode", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=128, help="prefill chunk (passed to every worker)")
    ap.add_argument("--probe-seconds", type=float, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    from disk_probe import probe
    from expert_paging import agent_stream

    arms = {}
    for spec in a.arm:
        label, rest = spec.split("=", 1)
        py, worker, *extra = rest.split(":")
        arms[label] = (py, worker, extra)
    prompt = Path(a.packed) / f"ab-agent-{a.prompt}.npy"
    Path(a.packed).mkdir(parents=True, exist_ok=True)
    np.save(prompt, agent_stream(Path(a.model), a.prompt))
    shares = [float(s) for s in a.shares.split(",")]
    rows, probes, ref = [], [], None
    first = next(iter(arms.values()))
    run_arm(first, a.model, a.packed, str(prompt), 0, 1, a.chunk)  # untimed: the dense part into the page cache
    for rnd in range(a.rounds):
        pr = probe(os.path.dirname(os.path.abspath(a.packed)) or "/tmp", file_gib=6, seconds=a.probe_seconds, keep=True)
        rand = {r["threads"]: r["gb_s"] for r in pr["rows"] if r["read"] == "random" and r["size"] > (1 << 20)}
        probes.append({"round": rnd, "random_12_75mib_gb_s": rand, "sequential_gb_s": pr["sequential_gb_s"],
                       "loadavg": loadavg()})
        print(f"round {rnd} probe 12.75 MiB random by threads {rand} load {loadavg()}", flush=True)
        for label, arm in arms.items():
            total = None  # the routed experts' bytes, from this arm's resident run (run first)
            for share in [0.0, *shares]:
                budget = int(total * share) if share else 0
                r = run_arm(arm, a.model, a.packed, str(prompt), budget, a.decode, a.chunk)
                total = total or r["info"]["expert_bytes_total"]
                pre = r["prefill_stats"]
                row = {"round": rnd, "arm": label, "share": share, "prefill_tok_s": r["prefill_tokens"] / r["prefill_s"],
                       "decode_tok_s": r["decode_tokens"] / r["decode_s"], "digest": r["digest"],
                       "loadavg": loadavg()}
                if share:
                    bw = pre["bytes_read"] / r["prefill_s"] / 1e9
                    row |= {"prefill_mb_read": pre["bytes_read"] / 1e6, "read_gb_s": bw, "of_probe_2": bw / rand[2], "of_probe_4": bw / rand[4],
                            "stall_frac": pre["stall_seconds"] / r["prefill_s"],
                            "disk_busy_frac": pre.get("read_busy_seconds", float("nan")) / r["prefill_s"],
                            "hit_rate": pre["hits"] / max(1, pre["hits"] + pre["misses"]),
                            "readers": r["info"].get("readers", 2)}
                    dec = r["decode_stats"]
                    mb_tok = dec["bytes_read"] / max(1, r["decode_tokens"]) / 1e6
                    row |= {"decode_stall_frac": dec["stall_seconds"] / r["decode_s"],
                            "decode_busy_frac": dec.get("read_busy_seconds", float("nan")) / r["decode_s"],
                            "decode_mb_per_tok": mb_tok,
                            # the rate the disk alone allows: probe bandwidth / bytes read per token
                            "decode_of_disk_bound": row["decode_tok_s"] * mb_tok / 1e3 / rand[4]}
                    for part, st in (("prefill", pre), ("decode", dec)):
                        if st.get("lookahead_guesses"):
                            row[f"{part}_lookahead_precision"] = st["lookahead_right"] / st["lookahead_guesses"]
                            row[f"{part}_lookahead_recall"] = st["lookahead_right"] / max(1, st["lookahead_keys"])
                            row[f"{part}_prefetch_reads"] = st["prefetch_reads"]
                            row[f"{part}_prefetch_used"] = st["prefetch_used"]
                ref = ref or row["digest"]
                row["bit_identical"] = row["digest"] == ref
                rows.append(row)
                print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()
                                  if k != "digest"}), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"probes": probes, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
