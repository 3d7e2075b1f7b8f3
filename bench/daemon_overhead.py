"""What the daemon adds to a cold prefill: the kernel alone against the daemon, on the same token ids.

    python bench/daemon_overhead.py MODEL_DIR [--tokens 3037] [--rounds 5] [--threads 2] [--chunk 128]
                                    [--gap SECONDS] [--shared-system] [--json out.json]

Each round, in alternating order:
  kernel   in this process, in one worker thread (as the daemon calls it): a new `State`, one
           `kernel.prefill(state, ids, chunk)` call, greedy first token (what the daemon's prefill
           and first decode step compute);
  daemon   `cairn serve` in a child process (same model, threads, chunk): a streamed
           `/v1/completions` with the ids, `max_tokens` 1, greedy; TTFT = the client's time from the
           first request byte to the first `data:` event (the token).
Every prompt is new random ids from 100 up (a generated model's special tokens are its first ids),
so nothing is reused: each daemon request is a cold prefill. The daemon's own breakdown comes from
its canonical `request` log line (`trace_ms`), read from its stdout (JSON lines), and the CPU its
event-loop thread used over each request (what could compete with the kernel's threads). One
warm-up request of each kind runs first and is not counted. Results: docs/benchmarks.md.

    python bench/daemon_overhead.py MODEL_DIR --decode 256 [--prompt 64] [--rounds 5] [--threads 1]
                                    [--speculate on|off] [--apis completions,chat,messages] [--no-stream]

--decode N: the daemon's own per-token cost in decode (the path from the kernel call's return to the
bytes on the socket). Each round, alternating which goes first:
  kernel   in this process, in one worker thread: a new `State`, prefill the prompt, then N - 1
           `kernel.decode` calls, each token the argmax of the last logits (what the daemon computes);
  daemon   for each API (`/v1/completions` and `/v1/chat/completions` with `ignore_eos`, Anthropic's
           `/v1/messages`): one greedy request of `max_tokens` N, streamed (or not: --no-stream).
Per-token wall = (end of the response - the first event) / completion tokens (not streamed: the
client's total less the daemon's `trace_ms.total`, received -> first token). Two overheads a token:
  vs alone   wall - the kernel-alone run's time per token (what a user sees against the bare kernel);
  own        wall - the daemon's own decode kernel calls (`decode_kernel_ms` in its request log line),
           the daemon's path alone, whatever the kernel's speed in that process;
  own CPU    the CPU the daemon process used over the request (all threads, /proc schedstat) less
           what its kernel thread used inside the decode calls (`decode_kernel_cpu_ms`), a token: what
           the path costs in work, which a loaded machine does not inflate as it does wall time (an
           upper bound: the prompt's parse and prefill count in it; with --threads > 1 OpenMP's
           workers' share of the kernel counts too, so read it with --threads 1);
  event loop's CPU  the Trio thread's own CPU over the request, a token (never the kernel's).
The daemon runs with CAIRN_DECODE_SPANS=1, so its request lines carry `spans_us` (actors/engine/spans.py):
per-token spans of the path, summed per request; the table prints their medians per token.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from cairn.daemon.cli.child import wait_until_serving


def post_ttft(sock_path: str, body: dict, timeout: float = 600) -> tuple[float, float, bytes]:
    """(seconds to the first `data:` event, seconds to the end of the response, the response)."""
    payload = json.dumps(body).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(sock_path)
    buf = b""
    first = None
    t0 = time.perf_counter()
    s.sendall(head + payload)
    while True:
        data = s.recv(65536)
        if not data:
            break
        buf += data
        if first is None and b"\ndata: " in buf:
            first = time.perf_counter() - t0
    total = time.perf_counter() - t0
    s.close()
    status = buf.split(b" ", 2)[1]
    if status != b"200" or first is None:
        raise RuntimeError(f"daemon answered {buf[:300]!r}")
    return first, total, buf


def process_cpu_s(pid: int) -> float:
    """CPU time all of a process's threads have run (Linux schedstat, ns): its threads persist across
    a request (the event loop, the kernel thread; OpenMP's workers), so a difference is the request's."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:          # a thread that just ended
            pass
    return total / 1e9


def thread_cpu_s(pid: int, tid: int) -> float:
    """CPU time a thread has run (Linux schedstat, ns)."""
    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def request_lines(log_path: Path) -> list[dict]:
    out = []
    for line in log_path.read_text().splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if ev.get("event") == "request":
            out.append(ev)
    return out


def shared_system_run(sock: str, model_id: str, model_dir: Path, tokens: int, prompt) -> dict:
    """Conversation A then conversation B, as raw ids: BOS + the same system part, then their own
    user message. B's first request should restore A's system capture (docs/prefill.md, rule 1b)."""
    from cairn.daemon.weights.model_dir import open_model_dir
    from cairn.daemon.protocol.tokenizer import TextTokenizer

    tok = TextTokenizer.from_model_dir(open_model_dir(model_dir))
    usr, asst = tok.token_to_id("<｜User｜>"), tok.token_to_id("<｜Assistant｜>")
    system = [tok.bos_id] + [int(t) for t in prompt(tokens - 47)]
    out: dict = {"system_tokens": len(system)}
    for name in ("A", "B"):
        ids = system + [usr] + [int(t) for t in prompt(44)] + [asst]
        body = {"model": model_id, "prompt": ids, "max_tokens": 1, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        ttft, _, sse = post_ttft(sock, body)
        usage = usage_of(sse) or {}
        out[f"{name}_prompt"] = usage.get("prompt_tokens")
        out[f"{name}_cached"] = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        out[f"{name}_ttft_ms"] = round(ttft * 1000)
    return out


def usage_of(sse: bytes) -> dict | None:
    """The `usage` object of a streamed answer (with stream_options.include_usage)."""
    for line in sse.split(b"\n"):
        if line.startswith(b"data: {"):
            ev = json.loads(line[6:])
            if ev.get("usage"):
                return ev["usage"]
    return None


API_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions", "messages": "/v1/messages"}


def decode_body(api: str, model_id: str, ids: list[int], text: str, n: int, stream: bool) -> dict:
    """A greedy request of exactly n tokens where the API allows it (`ignore_eos`; Anthropic's has no
    such field: a random model's EOS is rare, and the count comes from the reply's usage)."""
    if api == "completions":
        body = {"model": model_id, "prompt": ids, "ignore_eos": True}
    elif api == "chat":
        body = {"model": model_id, "messages": [{"role": "user", "content": text}], "ignore_eos": True}
    else:
        body = {"model": model_id, "messages": [{"role": "user", "content": text}]}
    body.update(max_tokens=n, temperature=0, stream=stream)
    if stream and api != "messages":
        body["stream_options"] = {"include_usage": True}
    return body


def post_decode(sock_path: str, path: str, body: dict, timeout: float = 600) -> tuple[float, float, int]:
    """(seconds from the first request byte to the first event, to the end of the response; tokens).
    The first event is sent when decoding starts (OpenAI's first chunk, Anthropic's message_start),
    before the first token is chosen. Not streamed: the first event time is 0."""
    payload = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(sock_path)
    parts: list[bytes] = []
    first = None
    t0 = time.perf_counter()
    s.sendall(head + payload)
    while True:
        data = s.recv(1 << 16)
        if not data:
            break
        if first is None and (b"data: " in data or b"event: " in data):
            first = time.perf_counter() - t0
        parts.append(data)
    total = time.perf_counter() - t0
    s.close()
    buf = b"".join(parts)
    if buf.split(b" ", 2)[1] != b"200":
        raise RuntimeError(f"daemon answered {buf[:300]!r}")
    tokens = None
    for m in re.finditer(rb'"(?:completion_tokens|output_tokens)":(\d+)', buf):
        tokens = int(m.group(1))             # the last one: the final usage
    if tokens is None:
        raise RuntimeError(f"no usage in the reply: {buf[-300:]!r}")
    return (first if body.get("stream") else 0.0), total, tokens


def decode_main(args, model, K, prompt) -> int:
    """--decode N: see the module docstring."""
    apis = args.apis.split(",")
    for a in apis:
        if a not in API_PATHS:
            raise SystemExit(f"--apis: unknown API {a!r}; allowed: {', '.join(API_PATHS)}")
    n = args.decode
    if n < 2:
        raise SystemExit(f"--decode: at least 2 tokens, got {n}")
    stream = not args.no_stream

    def kernel_call(ids: np.ndarray) -> float:
        st = K.State(model)
        _, logits = K.prefill(st, ids, chunk=args.chunk)
        tok = int(np.argmax(logits))
        t0 = time.perf_counter()
        for _ in range(n - 1):
            logits = K.decode(st, tok)
            tok = int(np.argmax(logits))
        return time.perf_counter() - t0

    kernel_thread = ThreadPoolExecutor(max_workers=1)
    tmp = Path(tempfile.mkdtemp(prefix="cairn-overhead-"))
    sock = str(tmp / "d.sock")
    log_path = tmp / "daemon.log"
    cmd = [sys.executable, "-m", "cairn.daemon.cli.main", "serve", "--model", str(args.model), "--socket", sock,
           "--threads", str(args.threads), "--chunk", str(args.chunk), "--slots", "1",
           "--speculate", args.speculate]
    env = {**os.environ, "NO_COLOR": "1", "CAIRN_DECODE_SPANS": "1"}
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
    words = ("def return class import self value list dict string index file path read write token state "
             "cache window layer").split()
    rng = np.random.default_rng(1)

    def text_prompt() -> str:
        return " ".join(rng.choice(words, size=args.prompt // 2))

    rows: list[dict] = []
    try:
        wait_until_serving(sock, proc, timeout=300)
        model_id = args.model.name

        def daemon_req(api: str, ids: np.ndarray) -> dict:
            body = decode_body(api, model_id, [int(t) for t in ids], text_prompt(), n, stream)
            cpu0, loop0 = process_cpu_s(proc.pid), thread_cpu_s(proc.pid, proc.pid)
            first, total, tokens = post_decode(sock, API_PATHS[api], body)
            return {"api": api, "first_s": first, "total_s": total, "tokens": tokens,
                    "cpu_s": process_cpu_s(proc.pid) - cpu0, "loop_cpu_s": thread_cpu_s(proc.pid, proc.pid) - loop0}

        kernel_thread.submit(kernel_call, prompt(args.prompt)).result()     # warm-up, not counted
        for api in apis:
            daemon_req(api, prompt(args.prompt))
        for r in range(args.rounds):
            kernel = None
            order = ("kernel", "daemon") if r % 2 == 0 else ("daemon", "kernel")
            got = []
            for what in order:
                ids = prompt(args.prompt)
                if what == "kernel":
                    kernel = kernel_thread.submit(kernel_call, ids).result() / n
                else:
                    got = [daemon_req(api, ids) for api in apis]
            for row in got:
                row["kernel_alone_s"] = kernel
                rows.append(row)
            print(f"round {r}: kernel alone {kernel * 1e3:.3f} ms a token; " + ", ".join(
                f"{row['api']} {row['tokens']} tokens in {(row['total_s'] - row['first_s']) * 1e3:.0f} ms"
                for row in got), flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    lines = request_lines(log_path)[len(apis):]     # the warm-up requests first
    if len(lines) != len(rows):
        raise SystemExit(f"{len(lines)} request lines in the daemon's log for {len(rows)} requests ({log_path})")
    for row, ev in zip(rows, lines):
        trace = ev.get("trace_ms") or {}
        decode_s = row["total_s"] - row["first_s"] if stream else row["total_s"] - trace.get("total", 0) / 1000
        row["wall_ms"] = decode_s / row["tokens"] * 1e3
        row["alone_ms"] = row["wall_ms"] - row["kernel_alone_s"] * 1e3
        kern = ev.get("decode_kernel_ms")
        row["daemon_kernel_ms"] = None if kern is None else kern / row["tokens"]
        row["own_ms"] = None if kern is None else row["wall_ms"] - row["daemon_kernel_ms"]
        kcpu = ev.get("decode_kernel_cpu_ms")
        row["own_cpu_ms"] = None if kcpu is None else (row["cpu_s"] * 1e3 - kcpu) / row["tokens"]
        row["loop_cpu_ms"] = row["loop_cpu_s"] * 1e3 / row["tokens"]
        row["spans_us"] = {k: v / row["tokens"] for k, v in (ev.get("spans_us") or {}).items()}
        row["speculation"] = ev.get("speculation")
    med = statistics.median
    print(f"\ndecode {n} tokens after a {args.prompt}-token prompt, {args.rounds} rounds, {args.threads} threads, "
          f"speculation {args.speculate}, {'streamed' if stream else 'not streamed'}; load {os.getloadavg()[0]:.2f}")
    print("per token, medians (ms): api | wall | kernel alone | daemon's kernel | overhead vs alone | own overhead "
          "| own CPU | event loop's CPU")
    for api in apis:
        rs = [r for r in rows if r["api"] == api]
        own = [r["own_ms"] for r in rs if r["own_ms"] is not None]
        dk = [r["daemon_kernel_ms"] for r in rs if r["daemon_kernel_ms"] is not None]
        print(f"  {api:11s} | {med(r['wall_ms'] for r in rs):.3f} | {med(r['kernel_alone_s'] for r in rs) * 1e3:.3f} | "
              f"{med(dk) if dk else float('nan'):.3f} | {med(r['alone_ms'] for r in rs):+.3f} | "
              f"{med(own) if own else float('nan'):+.3f} | "
              f"{med(r['own_cpu_ms'] for r in rs if r['own_cpu_ms'] is not None):.3f} | "
              f"{med(r['loop_cpu_ms'] for r in rs):.3f}")
        spans: dict[str, list[float]] = {}
        for r in rs:
            for k, v in r["spans_us"].items():
                spans.setdefault(k, []).append(v)
        if spans:
            print("    spans, us a token: " + ", ".join(f"{k} {med(v):.1f}"
                                                       for k, v in sorted(spans.items(), key=lambda kv: -med(kv[1]))))
    if args.json:
        Path(args.json).write_text(json.dumps({"decode": n, "rows": rows}, indent=2))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--tokens", type=int, default=3037)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--gap", type=float, default=0.0,
                    help="idle seconds before each measurement (a client's think time; trio's idle worker "
                         "threads exit after 10 s)")
    ap.add_argument("--shared-system", action="store_true",
                    help="also: two raw-id conversations whose first requests share a system part of "
                         "tokens-46 ids (template markers in the ids); the second's cached tokens and TTFT")
    ap.add_argument("--json")
    ap.add_argument("--decode", type=int, default=0,
                    help="measure decode instead: the daemon's per-token overhead over N tokens (docstring)")
    ap.add_argument("--prompt", type=int, default=64, help="--decode: prompt tokens")
    ap.add_argument("--speculate", choices=("on", "off"), default="off", help="--decode: the daemon's --speculate")
    ap.add_argument("--apis", default="completions,chat,messages", help="--decode: which APIs, comma-separated")
    ap.add_argument("--no-stream", action="store_true", help="--decode: whole responses instead of streams")
    args = ap.parse_args()

    from cairn import _kernel as K
    from cairn.daemon.weights.model_dir import load_model, open_model_dir

    model = load_model(open_model_dir(args.model), args.threads)
    vocab = int(model.vocab_size)
    rng = np.random.default_rng(0)

    def prompt(n: int) -> np.ndarray:
        return rng.integers(100, vocab, size=n).astype(np.int32)

    if args.decode:
        return decode_main(args, model, K, prompt)

    def kernel_call(ids: np.ndarray) -> float:
        t0 = time.perf_counter()
        st = K.State(model)
        n, logits = K.prefill(st, ids, chunk=args.chunk)
        int(np.argmax(logits))
        return time.perf_counter() - t0

    # From one worker thread, as the daemon calls it: under heavy load, libgomp's spin-waiting made
    # calls from the main thread 3-20x slower (3037 tokens on llama-peer at load ~8: 3-20 s against
    # 0.5-1 s; OMP_WAIT_POLICY=PASSIVE removed the gap; at load ~2 the two are equal).
    kernel_thread = ThreadPoolExecutor(max_workers=1)

    def kernel_once(ids: np.ndarray) -> float:
        return kernel_thread.submit(kernel_call, ids).result()

    tmp = Path(tempfile.mkdtemp(prefix="cairn-overhead-"))
    sock = str(tmp / "d.sock")
    log_path = tmp / "daemon.log"
    cmd = [sys.executable, "-m", "cairn.daemon.cli.main", "serve", "--model", str(args.model), "--socket", sock,
           "--threads", str(args.threads), "--chunk", str(args.chunk)]
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ, "NO_COLOR": "1"})
    try:
        wait_until_serving(sock, proc, timeout=300)

        model_id = args.model.name

        def daemon_req(ids: np.ndarray) -> tuple[float, float]:
            body = {"model": model_id, "prompt": [int(t) for t in ids], "max_tokens": 1, "temperature": 0,
                    "stream": True}
            return post_ttft(sock, body)[:2]

        kernel_once(prompt(256))
        daemon_req(prompt(256))
        rows = []
        for r in range(args.rounds):
            order = ("kernel", "daemon") if r % 2 == 0 else ("daemon", "kernel")
            row = {}
            for what in order:
                ids = prompt(args.tokens)
                time.sleep(args.gap)
                if what == "kernel":
                    row["kernel_s"] = kernel_once(ids)
                else:
                    cpu0 = thread_cpu_s(proc.pid, proc.pid)
                    row["daemon_ttft_s"], row["daemon_total_s"] = daemon_req(ids)
                    # the event loop's own CPU over the request: what could compete with the kernel
                    row["loop_cpu_s"] = thread_cpu_s(proc.pid, proc.pid) - cpu0
            rows.append(row)
            print(f"round {r}: kernel {row['kernel_s'] * 1000:.0f} ms, daemon TTFT {row['daemon_ttft_s'] * 1000:.0f} ms "
                  f"({(row['daemon_ttft_s'] / row['kernel_s'] - 1) * 100:+.1f} %)", flush=True)
        if args.shared_system:
            shared = shared_system_run(sock, model_id, args.model, args.tokens, prompt)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    lines = request_lines(log_path)[1:]      # the warm-up request first
    for row, ev in zip(rows, lines):
        row["daemon_log"] = {k: ev.get(k) for k in ("ttft_ms", "total_ms", "trace_ms")}
    k = [r["kernel_s"] for r in rows]
    d = [r["daemon_ttft_s"] for r in rows]
    ratio = [r["daemon_ttft_s"] / r["kernel_s"] - 1 for r in rows]
    print(f"\n{args.tokens} tokens, {args.rounds} rounds, chunk {args.chunk}, {args.threads} threads, "
          f"gap {args.gap:g} s; "
          f"load {os.getloadavg()[0]:.2f}")
    print(f"kernel alone  median {statistics.median(k) * 1000:.0f} ms  (min {min(k) * 1000:.0f})")
    print(f"daemon TTFT   median {statistics.median(d) * 1000:.0f} ms  (min {min(d) * 1000:.0f})")
    print(f"overhead      median {statistics.median(ratio) * 100:.1f} %  per round: "
          + ", ".join(f"{x * 100:.1f}" for x in ratio))
    loop = [r["loop_cpu_s"] for r in rows]
    print(f"event loop CPU per request  median {statistics.median(loop) * 1000:.1f} ms  (max {max(loop) * 1000:.1f})")
    phases: dict[str, list[float]] = {}
    for row in rows:
        for key, v in (row["daemon_log"].get("trace_ms") or {}).items():
            if isinstance(v, (int, float)):
                phases.setdefault(key, []).append(v)
    if phases:
        print("daemon trace (median ms): " + ", ".join(f"{k} {statistics.median(v):.1f}" for k, v in phases.items()))
    if args.shared_system:
        print("shared system part: " + ", ".join(f"{k} {v}" for k, v in shared.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"tokens": args.tokens, "rounds": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
