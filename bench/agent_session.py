"""An agent-style session against the real daemon, through its Unix socket (`make demo`).

An ~8k-token system prompt, then five turns that re-render the whole conversation the way agent
clients do (the previous assistant reply comes back as text, not as the tokens that were
generated), then a switch to a second conversation with the same system prompt and back. Run
three ways, side by side: checkpoints off, checkpoints in memory, and checkpoints from disk after
a daemon restart. Prints a table of TTFT per turn and the ratio to a full re-prefill.

    python bench/agent_session.py --model models/small [--turns 5] [--system-tokens 8000]
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
CAIRN = Path(sys.executable).with_name("cairn")


def system_prompt(target_tokens: int, tokenizer) -> str:
    """Deterministic agent-like instructions, about `target_tokens` long."""
    rules = [
        "You are a coding agent working in the user's repository.",
        "Read files before you change them and keep every change small.",
        "When a test fails, read the error and fix the cause, not the symptom.",
        "Use the tools to list, read, write and run; never guess file contents.",
        "Explain what you changed in one short paragraph at the end of each turn.",
    ]
    parts, i = [], 0
    while True:
        parts.append(f"Rule {i}: {rules[i % len(rules)]}")
        i += 1
        if i % 5 == 0 and len(tokenizer.encode("\n".join(parts))) >= target_tokens:
            return "\n".join(parts)


class Daemon:
    def __init__(self, model: Path, sock: Path, log: Path, *extra: str) -> None:
        self.sock = sock
        self.log = log
        args = [str(CAIRN), "serve", "--model", str(model), "--socket", str(sock), "--threads", "2", *extra]
        self.proc = subprocess.Popen(args, stdout=open(log, "ab"), stderr=subprocess.STDOUT)
        self.client = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://cairn",
                                   timeout=httpx.Timeout(None))
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"daemon exited with {self.proc.returncode}; see {log}")
            try:
                if self.client.get("/health").status_code == 200:
                    self.model_id = self.client.get("/v1/models").json()["data"][0]["id"]
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise SystemExit("daemon did not come up")

    def chat(self, messages: list[dict], max_tokens: int) -> tuple[float, str, int, int]:
        """Stream one turn; return (TTFT seconds, reply text, prompt tokens, cached tokens)."""
        body = {"model": self.model_id, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        t0 = time.perf_counter()
        ttft, text, usage = None, [], {}
        with self.client.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                raise SystemExit(f"HTTP {r.status_code}: {r.read().decode()}")
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                if ev.get("usage"):
                    usage = ev["usage"]
                for ch in ev.get("choices", []):
                    piece = ch.get("delta", {}).get("content")
                    if (piece or ch.get("finish_reason")) and ttft is None:
                        ttft = time.perf_counter() - t0
                    text.append(piece or "")
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        return ttft or 0.0, "".join(text), usage.get("prompt_tokens", 0), cached

    def checkpoints(self) -> list[dict]:
        r = self.client.get("/v1/checkpoints")
        return r.json().get("data", []) if r.status_code == 200 else []

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


def session_turns(system: str, turns: int) -> list[tuple[str, int]]:
    """(conversation, turn) in order: A's turns with a side trip to B after the third, and a
    return to B at the end: the client switching between two conversations that share a system prompt."""
    plan = [("A", i) for i in range(turns)]
    plan.insert(min(3, len(plan)), ("B", 0))
    plan.append(("B", 1))
    return plan


def run_session(d: Daemon, system: str, turns: int, max_tokens: int, session: str = "") -> list[dict]:
    """`session` tells sessions apart: a different one shares only the system prompt."""
    convs: dict[str, list[dict]] = {"A": [{"role": "system", "content": system}],
                                    "B": [{"role": "system", "content": system}]}
    rows = []
    for conv, i in session_turns(system, turns):
        msgs = convs[conv]
        msgs.append({"role": "user", "content": f"{session}Turn {i} of conversation {conv}: please fix test_{i}.py and "
                                                f"explain the change in two sentences."})
        ttft, text, prompt, cached = d.chat(msgs, max_tokens)
        msgs.append({"role": "assistant", "content": text})
        rows.append({"turn": f"{conv}{i}", "ttft": ttft, "prompt": prompt, "cached": cached})
        print(f"  {conv}{i}: prompt {prompt:6d}  cached {cached:6d}  TTFT {ttft:7.2f} s", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/small")
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--system-tokens", type=int, default=8000)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    from cairn.daemon.weights.model_dir import open_model_dir
    from cairn.daemon.protocol.tokenizer import TextTokenizer

    model = Path(args.model).resolve()
    tok = TextTokenizer.from_model_dir(open_model_dir(model))
    system = system_prompt(args.system_tokens, tok)
    work = Path(tempfile.mkdtemp(prefix="cairn-bench-"))
    sock, log, ckdir = work / "cairn.sock", work / "daemon.log", work / "checkpoints"
    results: dict[str, list[dict]] = {}
    try:
        print("checkpoints off:")
        d = Daemon(model, sock, log, "--no-checkpoints")
        results["off"] = run_session(d, system, args.turns, args.max_tokens)
        d.stop()

        print("checkpoints in memory:")
        d = Daemon(model, sock, log)
        results["memory"] = run_session(d, system, args.turns, args.max_tokens)
        d.stop()

        print("checkpoints on disk (first daemon writes them):")
        d = Daemon(model, sock, log, "--disk-checkpoints", "--checkpoint-dir", str(ckdir))
        run_session(d, system, args.turns, args.max_tokens)
        d.stop()
        print("checkpoints from disk after a restart:")
        d = Daemon(model, sock, log, "--disk-checkpoints", "--checkpoint-dir", str(ckdir))
        # A new session after the restart (not a replay): it shares only the system prompt with
        # what is on disk, so its first turn restores the system-prefix checkpoint from disk.
        results["disk"] = run_session(d, system, args.turns, args.max_tokens, session="After the restart: ")
        disk_files = sorted(ckdir.glob("*.ckpt"))
        d.stop()
    finally:
        print(f"(daemon log: {log})")

    full = results["off"][0]["ttft"]
    print()
    print(f"TTFT per turn (s); full prefill of the first turn = {full:.2f} s")
    print(f"{'turn':>5} {'prompt':>7} | {'off':>8} {'memory':>8} {'disk':>8} | {'mem/full':>8} {'disk/full':>9}")
    for off, mem, disk in zip(results["off"], results["memory"], results["disk"]):
        print(f"{off['turn']:>5} {off['prompt']:>7} | {off['ttft']:8.2f} {mem['ttft']:8.2f} {disk['ttft']:8.2f} | "
              f"{mem['ttft'] / full:8.1%} {disk['ttft'] / full:9.1%}")
    if disk_files:
        print(f"disk checkpoints: {len(disk_files)} files, {sum(f.stat().st_size for f in disk_files) / 1e6:.1f} MB")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    shutil.rmtree(ckdir, ignore_errors=True)  # the log stays for reading
    return 0


if __name__ == "__main__":
    sys.exit(main())
