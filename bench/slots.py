"""Several conversations at once (issue 14): batched decode and slot scheduling.

    python bench/slots.py MODEL_DIR [--threads 2] [--context 1024] [--steps 32] [--long 8192]
                          [--side 50] [--chunk 128] [--json out.json]
    python bench/slots.py MODEL_DIR --peer llama.cpp [--llama-cpp DIR] [--gguf FILE] [--rounds 3]

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
With `--peer llama.cpp`, only the sessions part, against llama.cpp's server with 4 slots (-np 4,
bench/llama_peer.py: same threads, ubatch = chunk, f32 KV, no prompt-cache RAM or context
checkpoints; `cache_prompt` on so a session's next turn reuses its slot): both servers up, the same
prompts for both, systems alternating (the first system flips every round), medians of `--rounds`.
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
from daemon_overhead import post_ttft  # noqa: E402
from cairn.daemon.cli.child import wait_until_serving  # noqa: E402


VOCAB = 8192   # set from the model's config.json in main()


def kernel_part(model_dir: str, threads: int, context: int, steps: int, rounds: int = 3) -> dict:
    """Per-step times of B = 1, 2, 4, in `rounds` interleaved rounds (the machine is shared: the
    median and the best step time are both reported)."""
    import cairn._kernel as K
    from cairn.daemon.weights.model_dir import load_model

    model = load_model(model_dir, threads=threads)
    rng = np.random.default_rng(0)
    sizes = (1, 2, 4)
    states = {B: [K.State(model) for _ in range(B)] for B in sizes}
    for B in sizes:
        for st in states[B]:
            K.prefill(st, rng.integers(100, model.vocab_size, context, dtype=np.int32), chunk=128)
    toks = {B: [int(rng.integers(100, model.vocab_size)) for _ in range(B)] for B in sizes}
    times: dict = {B: [] for B in sizes}
    for _ in range(rounds):
        for B in sizes:
            for _ in range(steps):
                t = time.perf_counter()
                if B == 1:
                    logits = K.decode(states[1][0], toks[1][0])[None]
                else:
                    logits = K.decode_batch(states[B], toks[B])
                times[B].append(time.perf_counter() - t)
                toks[B] = [int(x) for x in np.argmax(logits, axis=1)]
    out = {}
    for B in sizes:
        med, best = float(np.median(times[B])), float(np.min(times[B]))
        out[B] = {"step_ms_median": med * 1e3, "step_ms_best": best * 1e3,
                  "aggregate_tok_s_median": B / med, "aggregate_tok_s_best": B / best}
        print(f"kernel B={B}: step {med * 1e3:.1f} ms median ({B / med:.1f} tok/s aggregate), "
              f"{best * 1e3:.1f} ms best ({B / best:.1f} tok/s)", flush=True)
    return out


class Daemon:
    def __init__(self, model_dir: str, threads: int, chunk: int, slots: int, extra: tuple[str, ...] = ()) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        self.sock = os.path.join(self.tmp.name, "c.sock")
        log = open(os.path.join(self.tmp.name, "log"), "w")
        cmd = [sys.executable, "-m", "cairn.daemon.cli.main", "serve", "--model", model_dir, "--socket", self.sock,
               "--threads", str(threads), "--chunk", str(chunk), "--slots", str(slots), "--no-checkpoints", *extra]
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "NO_COLOR": "1"})
        wait_until_serving(self.sock, self.proc, timeout=300)
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

    def token_times(self, prompt, n: int) -> list[float]:
        """A streamed request; the arrival time of each `data:` event with a token."""
        import socket

        body = {"model": self.model, "prompt": [int(t) for t in prompt], "max_tokens": n, "temperature": 0,
                "ignore_eos": True, "stream": True}
        from llama_peer import sse_event_times

        s = socket.socket(socket.AF_UNIX)
        s.connect(self.sock)
        return sse_event_times(s, "/v1/completions", "localhost", body,
                               lambda block: b'"text"' in block and b'"finish_reason":null' in block)

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


def sessions(d, n: int, context: int, steps: int, rng, prompts=None) -> dict:
    """n agent sessions decoding at once. Each session's prompt is prefilled first (max_tokens 1,
    one after another: its slot keeps the state), then all n send their next turn together (the
    prompt plus one token: a one-token prefill on the live state) and decode `steps` tokens.
    Aggregate = token events of all streams inside the window where every stream decodes / window.
    `d`: a Daemon or a PeerSessions (same two calls); `prompts`: given to run both on the same ids."""
    if prompts is None:
        prompts = [rng.integers(100, VOCAB, context) for _ in range(n)]
    for p in prompts:
        d.stream(p, 1)
    res: list = [None] * n

    def go(i):
        res[i] = d.token_times(np.append(prompts[i], 100 + i), steps)

    ths = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    lo, hi = max(r[1] for r in res), min(r[-1] for r in res)   # from every stream's 2nd token
    inside = sum(sum(1 for t in r if lo < t <= hi) for r in res)
    per = [(len(r) - 1) / (r[-1] - r[0]) for r in res]
    return {"aggregate_tok_s": inside / (hi - lo), "per_stream_tok_s": float(np.mean(per)),
            "window_s": hi - lo}


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


class PeerSessions:
    """llama.cpp's server with 4 slots (-np 4) behind the two calls `sessions` makes."""

    def __init__(self, model_dir: str, threads: int, chunk: int, n_ctx: int, tools: str | None,
                 llama_cpp: str | None, gguf: str | None, log: str) -> None:
        import llama_peer as lp

        t = lp.tools_dir(tools)
        src = lp.llama_cpp_dir(t, llama_cpp)
        self.server = lp.LlamaServer(src, lp.ensure_gguf(t, src, model_dir, gguf), threads, chunk, n_ctx, log,
                                     slots=4)

    def stream(self, prompt, n: int) -> None:
        self.server.token_times([int(t) for t in prompt], n)

    def token_times(self, prompt, n: int) -> list[float]:
        return self.server.token_times([int(t) for t in prompt], n)

    def close(self) -> None:
        self.server.close()


def peer_part(args) -> dict:
    """cairn (--slots 4) against llama-server (-np 4): the same sessions, same token ids, both servers
    up, systems alternating per measurement, `--rounds` rounds; medians reported."""
    rng = np.random.default_rng(2)
    load_start = os.getloadavg()
    n_ctx = 4 * (args.context + args.steps + 64)
    peer = PeerSessions(args.model_dir, args.threads, args.chunk, n_ctx, args.peer_tools, args.llama_cpp,
                        args.gguf, os.path.join(tempfile.gettempdir(), f"llama-peer-slots-{os.getpid()}.log"))
    d = Daemon(args.model_dir, args.threads, args.chunk, slots=4)
    runs: dict = {"cairn": {n: [] for n in (1, 2, 4)}, "llama.cpp": {n: [] for n in (1, 2, 4)}}
    try:
        warm = [int(t) for t in rng.integers(100, VOCAB, 64)]
        d.stream(warm, 2)
        peer.stream(warm, 2)
        for r in range(args.rounds):
            for n in (1, 2, 4):
                prompts = [rng.integers(100, VOCAB, args.context) for _ in range(n)]
                order = [("cairn", d), ("llama.cpp", peer)]
                for name, system in (order if r % 2 == 0 else order[::-1]):
                    res = sessions(system, n, args.context, args.steps, rng, prompts=prompts)
                    runs[name][n].append(res)
                    print(f"round {r} {name:9s} {n} sessions: {res['aggregate_tok_s']:.1f} tok/s aggregate, "
                          f"{res['per_stream_tok_s']:.1f} per stream", flush=True)
    finally:
        d.close()
        peer.close()
    out: dict = {"runs": runs, "median": {}, "loadavg_start": load_start, "loadavg_end": os.getloadavg()}
    for name in runs:
        out["median"][name] = {n: {"aggregate_tok_s": float(np.median([x["aggregate_tok_s"] for x in runs[name][n]])),
                                   "per_stream_tok_s": float(np.median([x["per_stream_tok_s"] for x in runs[name][n]]))}
                               for n in (1, 2, 4)}
    for n in (1, 2, 4):
        c, p = out["median"]["cairn"][n], out["median"]["llama.cpp"][n]
        print(f"{n} sessions: cairn {c['aggregate_tok_s']:.1f} tok/s (x{c['aggregate_tok_s'] / out['median']['cairn'][1]['aggregate_tok_s']:.2f}), "
              f"llama.cpp {p['aggregate_tok_s']:.1f} tok/s (x{p['aggregate_tok_s'] / out['median']['llama.cpp'][1]['aggregate_tok_s']:.2f})",
              flush=True)
    return out


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
    ap.add_argument("--peer", choices=["llama.cpp"], help="only compare the sessions part with llama.cpp's "
                    "server on 4 slots (-np 4), alternating systems (bench/llama_peer.py converts and serves)")
    ap.add_argument("--rounds", type=int, default=3, help="--peer: measurements of each system and size")
    ap.add_argument("--peer-tools", help="the llama-peer tools (default ../shared/tools/llama-peer)")
    ap.add_argument("--llama-cpp", help="llama.cpp source folder with build/bin/llama-server (default: build.sh)")
    ap.add_argument("--gguf", help="the model's F32 GGUF (default: MODEL_DIR.f32.gguf, converted once)")
    args = ap.parse_args()
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)
    except ImportError:
        pass
    global VOCAB
    VOCAB = int(json.loads((Path(args.model_dir) / "config.json").read_text())["vocab_size"])
    out: dict = {"args": vars(args)}
    if args.peer:
        out["peer"] = peer_part(args)
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))
        return 0
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
