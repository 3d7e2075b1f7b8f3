"""Exact speculative decoding (issue 24 item 3): decode tok/s with and without prompt-lookup drafts.

    python bench/speculation.py MODEL_DIR [--threads 2] [--rounds 3] [--max-tokens 96]
                                [--expert-cache all|25%|...] [--edit-prompts N] [--skip-kernel] [--json out.json]

Part 1, kernel: what a verify call of S tokens costs against a decode step (S = 1, 2, 4, 8, 16, at
a 512-token context, interleaved rounds, medians). That ratio is what an accepted draft token has
to pay for: a draft of S - 1 tokens wins when the tokens it yields exceed verify(S) / decode.

Part 2, daemon: two `cairn serve` children on the same model, `--speculate on` and `off`, each
request sent to both, alternating which goes first, streamed; decode tok/s = (tokens - 1) / (last
token event - first token event). Two workloads, `--edit-prompts` of each, from this repository's Python files:
  * edit: a file's snippet in the prompt, then the start of its rewrite; the reply is the model's
    own greedy continuation (on models/cairn-code, which does not follow an instruction to edit, it
    writes the code again and repeats itself: text that is in the prompt, as an edit's is);
  * chat: a chat question whose answer is not in the prompt (nothing to copy).
Greedy (temperature 0), so the two daemons' replies must be identical: the script checks it. The
acceptance counters come from each daemon's /metrics. `--expert-cache 25%` pages routed experts.
Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent))
from slots import Daemon  # noqa: E402


def kernel_part(model_dir: str, threads: int, rounds: int, sizes=(1, 2, 4, 8, 16), context: int = 512) -> dict:
    import cairn._kernel as K
    from cairn.daemon.weights.model_dir import load_model

    model = load_model(model_dir, threads=threads)
    rng = np.random.default_rng(0)
    base = K.State(model)
    K.prefill(base, rng.integers(100, model.vocab_size, context, dtype=np.int32), chunk=128)
    snap = base.snapshot()
    warm = K.State.restore(model, snap)     # every weight touched once (mapped files page in) before timing
    K.verify(warm, rng.integers(100, model.vocab_size, max(sizes), dtype=np.int32))
    for _ in range(3):
        K.decode(warm, 100)
    times: dict[int, list[float]] = {S: [] for S in (0, *sizes)}    # 0: plain decode
    for _ in range(rounds):
        for S in (0, *sizes):
            st = K.State.restore(model, snap)
            toks = rng.integers(100, model.vocab_size, max(1, S), dtype=np.int32)
            reps = 8
            t0 = time.perf_counter()
            for _ in range(reps):
                if S == 0:
                    K.decode(st, int(toks[0]))
                else:
                    K.verify(st, toks)
                    K.rewind(st, S)          # back to the same context: every rep verifies at position 512
            times[S].append((time.perf_counter() - t0) / reps)
    dec = statistics.median(times[0])
    out = {"decode_ms": dec * 1e3, "verify": {}}
    print(f"kernel: decode {dec * 1e3:.2f} ms", flush=True)
    for S in sizes:
        v = statistics.median(times[S])
        out["verify"][S] = {"ms": v * 1e3, "x_decode": v / dec}
        print(f"kernel: verify S={S:2d} {v * 1e3:.2f} ms = {v / dec:.2f} x decode "
              f"(break-even: {v / dec:.2f} tokens per call)", flush=True)
    return out


def snippets(n: int, lines: int = 12) -> list[tuple[str, str]]:
    """n (path, snippet) pairs: `lines` lines from the middle of this repository's Python files."""
    files = sorted(p for d in ("actors", "daemon", "bench") for p in (ROOT / d).rglob("*.py"))
    out = []
    files = [p for p in files if len(p.read_text().splitlines()) >= 2 * lines]
    for p in files[:: max(1, len(files) // n)][:n]:
        text = p.read_text().splitlines()
        mid = max(0, len(text) // 2 - lines // 2)
        out.append((str(p.relative_to(ROOT)), "\n".join(text[mid:mid + lines])))
    return out


def metrics_of(d: Daemon) -> dict:
    text = d._get("/metrics").decode()
    out = {}
    for name in ("spec_drafts", "spec_draft_tokens", "spec_accepted_tokens", "decode_steps", "decode_tokens"):
        m = re.search(rf"^cairn_{name}_total (\S+)$", text, re.M)
        out[name] = float(m.group(1)) if m else 0.0
    return out


def stream(d: Daemon, prompt, n: int) -> tuple[float, int, str]:
    """(decode tok/s, tokens, text) of one greedy streamed request: a completion of a string prompt,
    or a chat completion of a list of messages."""
    import socket

    from llama_peer import sse_event_times

    chat = isinstance(prompt, list)
    body = {"model": d.model, "max_tokens": n, "temperature": 0, "stream": True,
            **({"messages": prompt} if chat else {"prompt": prompt})}
    texts: list[str] = []

    def is_token(block: bytes) -> bool:
        for line in block.split(b"\n"):
            if line.startswith(b"data:{") and b'"choices"' in line:
                ch = json.loads(line[5:])["choices"]
                if ch and ch[0].get("finish_reason") is None:
                    texts.append((ch[0].get("delta") or {}).get("content") or "" if chat else ch[0]["text"])
                    return True
        return False

    s = socket.socket(socket.AF_UNIX)
    s.connect(d.sock)
    times = sse_event_times(s, "/v1/chat/completions" if chat else "/v1/completions", "localhost", body, is_token)
    rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else float("nan")
    return rate, len(times), "".join(texts)


def daemon_part(model_dir: str, threads: int, rounds: int, max_tokens: int, expert_cache: str, n_edit: int) -> dict:
    """Both workloads on two daemons (drafts on / off), alternating; medians and acceptance."""
    pieces = snippets(n_edit)
    workloads = {
        # a file, then its rewrite begun: what the model writes next is its own (greedy) output
        "edit": [f"# {p}\n{s}\n\n\n# {p}, rewritten with the fix:\n" + s.splitlines()[0] + "\n"
                 for p, s in pieces],
        # a chat question whose answer is not in the prompt
        "chat": [[{"role": "user", "content": f"Write a Python function `{Path(p).stem}_helper` for {p}."}]
                 for p, _ in pieces],
    }
    extra = ("--expert-cache", expert_cache)
    daemons = {"on": Daemon(model_dir, threads, 128, 1, extra + ("--speculate", "on")),
               "off": Daemon(model_dir, threads, 128, 1, extra + ("--speculate", "off"))}
    out: dict = {"expert_cache": expert_cache}
    try:
        for name, prompts in workloads.items():
            before = {m: metrics_of(d) for m, d in daemons.items()}
            rates: dict[str, list[float]] = {"on": [], "off": []}
            tokens = {"on": 0, "off": 0}
            same = True
            for r in range(rounds):
                for i, prompt in enumerate(prompts):
                    order = ("on", "off") if (r + i) % 2 == 0 else ("off", "on")
                    got = {}
                    for m in order:
                        rate, n, text = stream(daemons[m], prompt, max_tokens)
                        rates[m].append(rate)
                        tokens[m] += n
                        got[m] = text
                    same &= got["on"] == got["off"]
            after = {m: metrics_of(d) for m, d in daemons.items()}
            delta = {m: {k: after[m][k] - before[m][k] for k in after[m]} for m in daemons}
            # a reply of one token (an immediate EOS) has no decode rate: left out, on both sides
            pairs = [(a, b) for a, b in zip(rates["on"], rates["off"]) if a == a and b == b]
            on, off = statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs)
            spec = delta["on"]
            res = {"decode_tok_s_on": on, "decode_tok_s_off": off, "ratio": on / off, "identical": same,
                   "requests": len(rates["on"]), "timed": len(pairs), "draft_tokens": spec["spec_draft_tokens"],
                   "accepted_tokens": spec["spec_accepted_tokens"],
                   "acceptance": spec["spec_accepted_tokens"] / max(1.0, spec["spec_draft_tokens"]),
                   "tokens_per_call_on": spec["decode_tokens"] / max(1.0, spec["decode_steps"]),
                   "tokens_per_call_off": delta["off"]["decode_tokens"] / max(1.0, delta["off"]["decode_steps"])}
            out[name] = res
            print(f"{name} (expert cache {expert_cache}): decode {on:.1f} tok/s with drafts, {off:.1f} without "
                  f"= {on / off:.2f}x; acceptance {res['acceptance']:.2f}, {res['tokens_per_call_on']:.2f} tokens "
                  f"per kernel call; identical replies: {same}", flush=True)
    finally:
        for d in daemons.values():
            d.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--expert-cache", default="all")
    ap.add_argument("--edit-prompts", type=int, default=8)
    ap.add_argument("--skip-kernel", action="store_true")
    ap.add_argument("--skip-daemon", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    res: dict = {"model": a.model_dir, "threads": a.threads}
    if not a.skip_kernel:
        res["kernel"] = kernel_part(a.model_dir, a.threads, a.rounds)
    if not a.skip_daemon:
        res["daemon"] = daemon_part(a.model_dir, a.threads, a.rounds, a.max_tokens, a.expert_cache, a.edit_prompts)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
