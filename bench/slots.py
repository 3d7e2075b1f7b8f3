"""Several conversations at once (issue 14): batched decode and slot scheduling.

    python bench/slots.py MODEL_DIR [--threads 2] [--context 1024] [--steps 32] [--long 8192]
                          [--side 50] [--chunk 128] [--json out.json]

Part 1, kernel: B = 1, 2, 4 states, each prefilled with its own `--context` random tokens, then
`--steps` decode steps: B = 1 with `decode`, B > 1 with one `decode_batch` per step. Aggregate
decode tok/s = B * steps / time (the weights are read once per step for all B).

Part 2, daemon (`cairn serve --slots 4` in a child process, `--chunk`):
  * sessions: 1, 2 and 4 concurrent streamed `/v1/completions` (own random prompt of `--context`
    tokens each, greedy, `--steps` tokens, ignore_eos); aggregate decode tok/s = all tokens after
    each stream's first / (last end - first first token), and the mean per-stream rate;
  * side request: a `--long`-token prefill (max_tokens 1) starts; once it has run about a second, a
    `--side`-token request (max_tokens 1) is sent; its TTFT against the same request on the idle
    daemon, and against `--slots 1` (where it waits for the whole long prefill).
Random ids from 100 up (a generated model's special tokens are its first ids): nothing is reused.
Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from daemon_overhead import post_ttft, wait_socket  # noqa: E402


VOCAB = 8192   # set from the model's config.json in main()


def kernel_part(model_dir: str, threads: int, context: int, steps: int) -> dict:
    import cairn._kernel as K
    from cairn.daemon.model_dir import load_model

    model = load_model(model_dir, threads=threads)
    rng = np.random.default_rng(0)
    out = {}
    for B in (1, 2, 4):
        states = [K.State(model) for _ in range(B)]
        for st in states:
            K.prefill(st, rng.integers(100, model.vocab_size, context, dtype=np.int32), chunk=128)
        toks = [int(rng.integers(100, model.vocab_size)) for _ in range(B)]
        t = time.perf_counter()
        for _ in range(steps):
            if B == 1:
                toks = [int(np.argmax(K.decode(states[0], toks[0])))]
            else:
                logits = K.decode_batch(states, toks)
                toks = [int(t) for t in np.argmax(logits, axis=1)]
        dt = time.perf_counter() - t
        out[B] = {"aggregate_tok_s": B * steps / dt, "step_ms": dt / steps * 1e3}
        print(f"kernel B={B}: {out[B]['aggregate_tok_s']:.1f} tok/s aggregate, {out[B]['step_ms']:.1f} ms/step",
              flush=True)
    return out


class Daemon:
    def __init__(self, model_dir: str, threads: int, chunk: int, slots: int) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        self.sock = os.path.join(self.tmp.name, "c.sock")
        log = open(os.path.join(self.tmp.name, "log"), "w")
        cmd = [sys.executable, "-m", "cairn.daemon.cli", "serve", "--model", model_dir, "--socket", self.sock,
               "--threads", str(threads), "--chunk", str(chunk), "--slots", str(slots), "--no-checkpoints"]
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "NO_COLOR": "1"})
        wait_socket(self.sock, self.proc)
        self.model = json.loads(self._get("/v1/models"))["data"][0]["id"]

    def _get(self, path: str) -> bytes:
        import socket

        s = socket.socket(socket.AF_UNIX)
        s.connect(self.sock)
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
        buf = b""
        while d := s.recv(65536):
            buf += d
        s.close()
        return buf.partition(b"\r\n\r\n")[2]

    def stream(self, prompt, n: int) -> dict:
        """One streamed request: times of its first and last token event."""
        body = {"model": self.model, "prompt": [int(t) for t in prompt], "max_tokens": n, "temperature": 0,
                "ignore_eos": True, "stream": True}
        t0 = time.perf_counter()
        first, total, _ = post_ttft(self.sock, body)
        return {"start": t0, "first": t0 + first, "end": t0 + total, "tokens": n}

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)
        self.tmp.cleanup()


def sessions(d: Daemon, n: int, context: int, steps: int, rng) -> dict:
    prompts = [rng.integers(100, VOCAB, context) for _ in range(n)]
    res: list = [None] * n

    def go(i):
        res[i] = d.stream(prompts[i], steps)

    ths = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    t_first = min(r["first"] for r in res)
    t_end = max(r["end"] for r in res)
    agg = sum(r["tokens"] - 1 for r in res) / (t_end - t_first)
    per = [(r["tokens"] - 1) / (r["end"] - r["first"]) for r in res]
    return {"aggregate_tok_s": agg, "per_stream_tok_s": float(np.mean(per))}


def side_ttft(d: Daemon, long_n: int, side_n: int, rng, head_start: float = 1.0) -> dict:
    alone = d.stream(rng.integers(100, VOCAB, side_n), 1)
    res: dict = {}
    th = threading.Thread(target=lambda: res.setdefault("long", d.stream(rng.integers(100, VOCAB, long_n), 1)))
    th.start()
    time.sleep(head_start)
    side = d.stream(rng.integers(100, VOCAB, side_n), 1)
    th.join()
    return {"side_alone_ttft_s": alone["first"] - alone["start"], "side_during_long_ttft_s": side["first"] - side["start"],
            "long_ttft_s": res["long"]["first"] - res["long"]["start"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--long", type=int, default=8192)
    ap.add_argument("--side", type=int, default=50)
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--skip-kernel", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)
    except ImportError:
        pass
    global VOCAB
    VOCAB = int(json.loads((Path(args.model_dir) / "config.json").read_text())["vocab_size"])
    out: dict = {"args": vars(args)}
    if not args.skip_kernel:
        out["kernel"] = kernel_part(args.model_dir, args.threads, args.context, args.steps)
    rng = np.random.default_rng(1)
    d = Daemon(args.model_dir, args.threads, args.chunk, slots=4)
    try:
        d.stream(rng.integers(100, VOCAB, 64), 2)   # warm-up
        out["daemon_sessions"] = {}
        for n in (1, 2, 4):
            r = out["daemon_sessions"][n] = sessions(d, n, args.context, args.steps, rng)
            print(f"daemon {n} sessions: {r['aggregate_tok_s']:.1f} tok/s aggregate, "
                  f"{r['per_stream_tok_s']:.1f} per stream", flush=True)
        out["side_slots4"] = side_ttft(d, args.long, args.side, rng)
        print("slots 4:", out["side_slots4"], flush=True)
    finally:
        d.close()
    d = Daemon(args.model_dir, args.threads, args.chunk, slots=1)
    try:
        d.stream(rng.integers(100, VOCAB, 64), 2)
        r = out["daemon_sessions_slots1"] = sessions(d, 1, args.context, args.steps, rng)
        print(f"daemon slots 1, 1 session: {r['aggregate_tok_s']:.1f} tok/s", flush=True)
        out["side_slots1"] = side_ttft(d, args.long, args.side, rng)
        print("slots 1:", out["side_slots1"], flush=True)
    finally:
        d.close()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
