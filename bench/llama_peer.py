"""llama.cpp as the peer of bench/kernel.py: built, converted and served by the shared llama-peer tools.

The tools live outside this repository (default `../shared/tools/llama-peer/` next to it; read their
README): `build.sh` builds llama.cpp from the llama-cpp-python sdist, `convert_hf_v4.py` writes an F32
GGUF of our model directory. This module only calls them, then runs `llama-server` on that GGUF and
times prompts of given token ids through `/completion` with the server's own timings.

Fairness (docs/benchmarks/2026-12-01.md, "equal work"): same token ids, same threads, ubatch = the kernel's chunk, f32 KV cache,
prompt cache and context checkpoints off, greedy decode of exactly `n_decode` steps.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TOOLS = REPO.parent / "shared" / "tools" / "llama-peer"


class PeerError(RuntimeError):
    pass


def tools_dir(path: str | None) -> Path:
    d = Path(path) if path else DEFAULT_TOOLS
    if not (d / "build.sh").is_file() or not (d / "convert_hf_v4.py").is_file():
        raise PeerError(f"--peer-tools: {d} has no build.sh / convert_hf_v4.py (the llama-peer tools; "
                        f"default is ../shared/tools/llama-peer next to the repository)")
    return d


def llama_cpp_dir(tools: Path, given: str | None) -> Path:
    """The llama.cpp source folder with build/bin/. `build.sh` reuses a finished build and prints the
    folder; without one it builds (~16-20 min on 2 cores)."""
    if given:
        src = Path(given)
    else:
        print("  llama.cpp: build.sh (reuses a finished build; a first build takes ~20 min)", file=sys.stderr)
        r = subprocess.run(["bash", str(tools / "build.sh")], capture_output=True, text=True)
        if r.returncode != 0:
            raise PeerError(f"llama-peer build.sh failed:\n{r.stderr[-2000:]}")
        src = Path(r.stdout.strip().splitlines()[-1])
    for exe in ("llama-server",):
        if not os.access(src / "build" / "bin" / exe, os.X_OK):
            raise PeerError(f"--llama-cpp: {src}/build/bin/{exe} is missing (run build.sh)")
    return src


def ensure_gguf(tools: Path, src: Path, model_dir: str, gguf: str | None) -> Path:
    """The F32 GGUF of model_dir (default: <model_dir>.f32.gguf beside it), converted once."""
    out = Path(gguf) if gguf else Path(str(Path(model_dir).resolve()) + ".f32.gguf")
    if out.exists():
        return out
    try:
        import yaml  # noqa: F401  (llama.cpp's converter imports it)
    except ImportError:
        raise PeerError("converting to GGUF needs pyyaml in this python (the 'bench' extra): "
                        ".venv/bin/pip install pyyaml") from None
    print(f"  converting {model_dir} -> {out}", file=sys.stderr)
    tmp = out.with_suffix(".partial")
    r = subprocess.run([sys.executable, str(tools / "convert_hf_v4.py"), str(src), str(model_dir), str(tmp)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise PeerError(f"convert_hf_v4.py failed:\n{r.stderr[-3000:]}")
    tmp.rename(out)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(exe: Path, gguf: Path, threads: int, chunk: int, n_ctx: int, port: int,
                   slots: int = 1, extend: bool = False, slot_dir: str | None = None) -> list[str]:
    """llama-server doing the kernel's work: `slots` slots (-np; n_ctx is split between them), `threads`
    threads for prompt and decode, ubatch = the kernel's chunk, f32 KV cache like the kernel's fp32
    state, and no prompt cache (-cram 0) or context checkpoints (-ctxcp 0): each prompt is computed
    from scratch, with no state copies the kernel run does not make. extend (bench/depth.py): keep its
    default context checkpoints, so a prompt that extends the last one resumes from a checkpoint near
    that prompt's end (the kernel's restore of its snapshot) instead of recomputing it."""
    keep = [] if extend else ["-ctxcp", "0", "-cram", "0"]
    save = ["--slot-save-path", slot_dir] if slot_dir else []   # slot_dir: save_slot / restore_slot's files
    return [str(exe), "-m", str(gguf), "-t", str(threads), "-tb", str(threads), "-c", str(n_ctx), "-np", str(slots),
            "-b", str(max(chunk, 2048)), "-ub", str(chunk), "-ctk", "f32", "-ctv", "f32",
            *keep, *save, "--host", "127.0.0.1", "--port", str(port)]


def check_timings(t: dict, n_prompt: int, n_predict: int) -> dict:
    """The server's timings of one request, refused unless it computed the whole prompt (a cached
    prefix or an added BOS would make the runs unequal) and generated exactly n_predict tokens."""
    if t["prompt_n"] != n_prompt:
        raise PeerError(f"llama-server processed {t['prompt_n']} prompt tokens, sent {n_prompt}")
    if t["predicted_n"] != n_predict:
        raise PeerError(f"llama-server generated {t['predicted_n']} tokens, asked {n_predict}")
    return t


def sse_event_times(s: socket.socket, path: str, host: str, body: dict, is_token) -> list[float]:
    """POST `body` as JSON on the connected socket `s` (closed at the end) and return the arrival time
    of each SSE `data:` event for which `is_token(block without spaces)` holds."""
    payload = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()
    with s:
        s.sendall(head + payload)
        times, buf = [], b""
        while d := s.recv(65536):
            now = time.perf_counter()
            buf += d
            while b"\n\n" in buf:
                block, buf = buf.split(b"\n\n", 1)
                if b"data: " in block and is_token(block.replace(b" ", b"")):
                    times.append(now)
    return times


class LlamaServer:
    """llama-server on `slots` slots (default one), context n_ctx, ubatch = chunk, f32 KV, no prompt cache or checkpoints."""

    def __init__(self, src: Path, gguf: Path, threads: int, chunk: int, n_ctx: int, log: str, slots: int = 1,
                 extend: bool = False, slot_dir: str | None = None):
        self.port = _free_port()
        self.cmd = server_command(src / "build" / "bin" / "llama-server", gguf, threads, chunk, n_ctx, self.port,
                                  slots, extend, slot_dir)
        self.log = open(log, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while True:
            if self.proc.poll() is not None:
                raise PeerError(f"llama-server exited ({self.proc.returncode}); see {log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.close()
                raise PeerError(f"llama-server not ready after 300 s; see {log}")
            time.sleep(0.5)

    def _post(self, path: str, body: dict) -> dict:
        """POST `body` as JSON (a new connection); the JSON answer. A 64k prompt takes most of an hour."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=7200) as r:
            return json.loads(r.read())

    def timings(self, ids: list[int], n_predict: int, cache_prompt: bool) -> dict:
        """One request: the prompt as token ids, greedy, n_predict tokens. Returns the server's `timings`
        (prompt_n, prompt_ms, predicted_n, predicted_ms, ...), refused unless it generated n_predict."""
        body = {"prompt": ids, "n_predict": n_predict, "temperature": 0.0, "ignore_eos": True,
                "cache_prompt": cache_prompt, "stream": False}
        t = self._post("/completion", body)["timings"]
        if t["predicted_n"] != n_predict:
            raise PeerError(f"llama-server generated {t['predicted_n']} tokens, asked {n_predict}")
        return t

    def complete(self, ids: list[int], n_predict: int) -> dict:
        """`timings` of a prompt computed whole (no cached prefix), refused otherwise (check_timings)."""
        return check_timings(self.timings(ids, n_predict, cache_prompt=False), len(ids), n_predict)

    def token_times(self, ids: list[int], n_predict: int, cache_prompt: bool = True) -> list[float]:
        """A streamed request (a new connection): the arrival time of each token event. cache_prompt
        lets the request reuse the KV of the slot that holds its prefix (an agent session's next turn)."""
        body = {"prompt": ids, "n_predict": n_predict, "temperature": 0.0, "ignore_eos": True,
                "cache_prompt": cache_prompt, "stream": True}
        return sse_event_times(socket.create_connection(("127.0.0.1", self.port)), "/completion", "127.0.0.1",
                               body, lambda block: b'"stop":false' in block)

    def slot_file(self, action: str, filename: str) -> int:
        """Slot 0's cached tokens and state saved to / restored from `filename` in the server's slot
        directory (action "save" / "restore"); the tokens it saved or restored."""
        out = self._post(f"/slots/0?action={action}", {"filename": filename})
        return int(out["n_saved" if action == "save" else "n_restored"])

    def close(self) -> None:
        stop_process(self.proc)
        self.log.close()


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM, 30 s to exit, then SIGKILL."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_llama(server: LlamaServer, prompts: dict[int, list[int]], n_decode: int) -> dict:
    """Prefill each prompt (1 token generated: its time is the prompt's), then decode n_decode steps
    after the longest: n_decode + 1 tokens, the first from the prompt's logits; the server's
    predicted_ms runs from that first token to the last, i.e. over the n_decode decode steps."""
    out: dict = {"prefill": {}}
    lengths = sorted(prompts)
    for n in lengths[:-1]:
        t = server.complete(prompts[n], 1)
        out["prefill"][n] = {"tok_s": n / (t["prompt_ms"] / 1e3), "s": t["prompt_ms"] / 1e3}
    n = lengths[-1]
    t = server.complete(prompts[n], n_decode + 1)
    out["prefill"][n] = {"tok_s": n / (t["prompt_ms"] / 1e3), "s": t["prompt_ms"] / 1e3}
    out["decode_tok_s"] = n_decode / (t["predicted_ms"] / 1e3)
    out["decode_at"] = n
    for n in lengths:
        print(f"  llama.cpp prefill {n:6d}: {out['prefill'][n]['tok_s']:8.1f} tok/s", file=sys.stderr)
    print(f"  llama.cpp decode at {out['decode_at']}: {out['decode_tok_s']:.1f} tok/s", file=sys.stderr)
    return out
