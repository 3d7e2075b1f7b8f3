"""An agent-style session against the real daemon, through its Unix socket (`make demo`).

An ~8k-token system prompt, then five turns that re-render the whole conversation the way agent
clients do (the previous assistant reply comes back as text, not as the tokens that were
generated), then a switch to a second conversation with the same system prompt and back. Run
three ways, side by side: checkpoints off, checkpoints in memory, and checkpoints from disk after
a daemon restart. Prints a table of TTFT per turn and the ratio to a full re-prefill.

    python bench/agent_session.py --model models/small [--turns 5] [--system-tokens 8000]

`--sub-agents`: a main conversation plus two sub-agents sharing its system prompt, interleaved
(main, A, B, main, A, B, ...), the main context past 64k tokens by its last turn, against two
daemons at once — checkpoints over shared pages (`checkpoint_share_pages=true`) and full copies
(`false`, the behaviour before pages) — at the default checkpoint budget scaled to the model's
state size. Every switch back (each request after a conversation's first): where its prefix came
from (the `checkpoint_hit` tier, or miss / live) and its TTFT. See docs/benchmarks/checkpoints.md
"Agent session: switch backs, pages vs full copies".

    python bench/agent_session.py --sub-agents --model /work/bench-small [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np

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
    def __init__(self, model: Path, sock: Path, log: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.sock = sock
        self.log = log
        args = [str(CAIRN), "serve", "--model", str(model), "--socket", str(sock), "--threads", "2", *extra]
        self.proc = subprocess.Popen(args, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                                     env=None if env is None else {**os.environ, **env})
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


# ---- --sub-agents: a main conversation and two sub-agents, pages vs full copies -----------------

FLASH_BYTES_PER_TOKEN = 13_760     # V4-Flash's compressed rows per token (docs/prefill.md "Size per prefix")
DEFAULT_BUDGET_MB = 2048           # checkpoint_memory_mb's default, sized for V4-Flash
MODES = ("pages", "copies")        # checkpoint_share_pages = true / false


@dataclass(frozen=True)
class Shape:
    system_tokens: int       # BOS + the shared system prompt
    main_turn_tokens: int    # what each main-conversation turn adds (user marker .. assistant prefix)
    sub_turn_tokens: int     # the same for each sub-agent turn
    turns: int               # turns per conversation
    max_tokens: int          # reply length (greedy)


FULL = Shape(system_tokens=8000, main_turn_tokens=5700, sub_turn_tokens=1000, turns=10, max_tokens=8)
# For tests/e2e/test_bench_agent_session.py on the tiny preset: every capture still >= 512 tokens
# (checkpoint_min_tokens), so it exercises the same capture and restore paths in a few seconds.
QUICK = Shape(system_tokens=600, main_turn_tokens=300, sub_turn_tokens=100, turns=3, max_tokens=4)
CONVERSATIONS = ("main", "A", "B")


def schedule(turns: int) -> list[tuple[str, int]]:
    """main, A, B, main, A, B, ...: the agent hands work to two sub-agents and reads their replies."""
    return [(conv, t) for t in range(turns) for conv in CONVERSATIONS]


@dataclass(frozen=True)
class Vocab:
    """The ids a prompt is built from, read from tokenizer.json (no tokenizer needed to build it)."""
    bos: int
    eos: int
    user: int
    assistant: int
    end_think: int
    ordinary: np.ndarray     # ids that are no special token: the filler of every message

    @classmethod
    def from_model_dir(cls, model: Path) -> "Vocab":
        tj = json.loads((model / "tokenizer.json").read_text())
        added = {a["content"]: int(a["id"]) for a in tj.get("added_tokens", [])}
        cfg = json.loads((model / "config.json").read_text())
        need = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "</think>")
        missing = [t for t in need if t not in added]
        if missing:
            raise SystemExit(f"{model}/tokenizer.json: no DeepSeek-V4 template token {missing[0]!r} "
                             f"(needed to write messages as ids)")
        ordinary = np.setdiff1d(np.arange(int(cfg["vocab_size"])), np.fromiter(added.values(), dtype=np.int64))
        return cls(*(added[t] for t in need), ordinary=ordinary)


def conversation_turns(vocab: Vocab, shape: Shape, seed: int = 0) -> dict[str, list[list[int]]]:
    """Each conversation's new messages as ids, per turn, the DeepSeek-V4 template's way (no thinking):
    turn 0 starts with BOS + the shared system prompt; every turn is `<｜User｜>` + content +
    `<｜Assistant｜></think>`. Content is seeded filler ids: the kernel's work does not depend on it."""
    rng = np.random.default_rng(seed)

    def filler(n: int) -> list[int]:
        return [int(i) for i in rng.choice(vocab.ordinary, size=n)]

    system = [vocab.bos] + filler(shape.system_tokens - 1)
    out: dict[str, list[list[int]]] = {}
    for conv in CONVERSATIONS:
        size = shape.main_turn_tokens if conv == "main" else shape.sub_turn_tokens
        turns = [[vocab.user] + filler(size - 3) + [vocab.assistant, vocab.end_think] for _ in range(shape.turns)]
        turns[0] = system + turns[0]
        out[conv] = turns
    return out


def longest_prompt(shape: Shape) -> int:
    """The main conversation's last prompt at the longest replies (each reply + its end of sentence)."""
    return shape.system_tokens + shape.turns * shape.main_turn_tokens + (shape.turns - 1) * (shape.max_tokens + 1)


def state_bytes_per_token(model: Path, n: int, threads: int) -> dict:
    """A kernel State prefilled with n ordinary ids: nbytes / n (the basis of the scaled budget),
    and the slope between n/2 and n (what each further token adds, as 13,760 is for V4-Flash)."""
    from cairn import _kernel as K
    from cairn.daemon.weights.model_dir import load_model, open_model_dir

    m = load_model(open_model_dir(model), threads)
    ids = np.random.default_rng(1).choice(Vocab.from_model_dir(model).ordinary, size=n).astype(np.int32)
    st = K.State(m)
    K.prefill(st, ids[: n // 2], chunk=128)
    half = int(st.nbytes)
    K.prefill(st, ids[n // 2:], chunk=128)
    full = int(st.nbytes)
    return {"n": n, "nbytes": full, "per_token": full / n, "slope": (full - half) / (n - n // 2)}


def scaled_budget_mb(per_token: float) -> int:
    """checkpoint_memory_mb's default scaled from V4-Flash's state size to this model's (at least 1 MiB)."""
    return max(1, round(DEFAULT_BUDGET_MB * per_token / FLASH_BYTES_PER_TOKEN))


class LogTail:
    """The daemon's JSON log lines written since the last read."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0

    def read(self) -> list[dict]:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        cut = data.rfind(b"\n") + 1          # a line still being written waits for the next read
        self.offset += cut
        out = []
        for line in data[:cut].splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if isinstance(ev, dict):
                out.append(ev)
        return out


def complete_ids(d: Daemon, ids: list[int], max_tokens: int) -> dict:
    """One streamed /v1/completions request with a token-id prompt: TTFT (first streamed token),
    wall time, the reply text, usage, and the request id (the log's request_id)."""
    body = {"model": d.model_id, "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft, text, usage, rid = None, [], {}, None
    with d.client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise SystemExit(f"HTTP {r.status_code}: {r.read().decode()}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue          # SSE comments are prefill progress, not tokens
            ev = json.loads(line[6:])
            rid = rid or ev.get("id")
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices", []):
                if (ch.get("text") or ch.get("finish_reason")) and ttft is None:
                    ttft = time.perf_counter() - t0
                text.append(ch.get("text") or "")
    wall = time.perf_counter() - t0
    return {"rid": rid, "ttft": ttft if ttft is not None else wall, "wall": wall, "text": "".join(text),
            "prompt": int(usage.get("prompt_tokens", 0)),
            "cached": int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))}


def classify(rid: str, cached: int, events: list[dict], origin: dict[str, str]) -> dict:
    """Where a request's prefix came from, from its log lines: the checkpoint_hit's tier and which
    capture it was (`origin`: checkpoint id -> "main t3 prompt_end"), else live (cached tokens
    without a hit: the live state extended) or miss (with the checkpoint_miss detail)."""
    mine = [e for e in events if e.get("request_id") == rid]
    hits = [e for e in mine if e.get("event") == "checkpoint_hit"]
    if hits:
        h = hits[-1]        # a restore that went bad is planned again: the last hit served it
        return {"source": h.get("tier", "memory"), "from": f"{origin.get(h.get('id'), h.get('id'))}, {h.get('tokens')}",
                "from_kind": h.get("kind"), "from_tokens": h.get("tokens")}
    if cached > 0:
        return {"source": "live", "from": None, "from_kind": None, "from_tokens": cached}
    misses = [e for e in mine if e.get("event") == "checkpoint_miss"]
    return {"source": "miss", "from": misses[-1].get("detail") if misses else None, "from_kind": None,
            "from_tokens": 0}


def summarize(rows: list[dict]) -> dict:
    """Per mode: switch backs by source, prefill work, time, memory, captures and evictions."""
    back = [r for r in rows if r["switch_back"]]
    by_source: dict[str, int] = {}
    for r in back:
        by_source[r["source"]] = by_source.get(r["source"], 0) + 1
    return {
        "requests": len(rows), "switch_backs": len(back), "switch_backs_by_source": by_source,
        "switch_backs_from_memory": by_source.get("memory", 0),
        # the whole previous prompt restored from memory: only the reply and the new turn are prefilled
        "switch_backs_whole_from_memory": sum(r["source"] == "memory" and r["recomputed"] == 0 for r in back),
        "switch_backs_partial": sum(r["recomputed"] > 0 for r in back),
        "recomputed_tokens": sum(r["recomputed"] for r in back),
        "prefill_tokens": sum(r["prompt"] - r["cached"] for r in rows),
        "switch_back_prefill_tokens": sum(r["prompt"] - r["cached"] for r in back),
        "wall_s": sum(r["wall"] for r in rows),
        "switch_back_ttft_s": sum(r["ttft"] for r in back),
        "peak_checkpoint_bytes": max((r["checkpoint_bytes"] for r in rows), default=0),
        "captures": sum(r["captures"] for r in rows),
        "captured_copied_bytes": sum(r["copied_bytes"] for r in rows),
        "evictions": sum(r["evictions"] for r in rows),
        "captures_skipped": sum(len(r["skipped"]) for r in rows),
    }


def _mb(n: float) -> str:
    return f"{n / 2**20:.1f}"


def print_tables(rows: dict[str, list[dict]], sums: dict[str, dict], budget_mb: int) -> None:
    """Markdown: one row per request, both modes side by side; then the summary."""
    print()
    print("| # | conv | turn | prompt | pages: cached | source | TTFT s | copies: cached | source | TTFT s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for i, (p, c) in enumerate(zip(rows["pages"], rows["copies"])):
        def cell(r: dict) -> str:
            src = r["source"] if r["source"] != "memory" else f"memory ({r['from']})"
            return f"{r['cached']} | {src} | {r['ttft']:.2f}"
        mark = "" if p["switch_back"] else " (first)"
        print(f"| {i + 1} | {p['conv']} | {p['turn']}{mark} | {p['prompt']} | {cell(p)} | {cell(c)} |")
    print()
    print(f"checkpoint_memory_mb = {budget_mb}")
    print()
    print("| | pages (share_pages=true) | full copies (false) |")
    print("|---|---|---|")
    s, c = sums["pages"], sums["copies"]
    def src(x: dict) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(x["switch_backs_by_source"].items()))
    lines = [
        ("switch backs restored from memory", f"{s['switch_backs_from_memory']} / {s['switch_backs']}",
         f"{c['switch_backs_from_memory']} / {c['switch_backs']}"),
        ("... of them, the whole previous prompt", f"{s['switch_backs_whole_from_memory']} / {s['switch_backs']}",
         f"{c['switch_backs_whole_from_memory']} / {c['switch_backs']}"),
        ("switch backs restoring a shorter prefix / tokens of earlier turns prefilled again",
         f"{s['switch_backs_partial']} / {s['recomputed_tokens']:,}", f"{c['switch_backs_partial']} / {c['recomputed_tokens']:,}"),
        ("switch backs by source", src(s), src(c)),
        ("prefill tokens, all requests", f"{s['prefill_tokens']:,}", f"{c['prefill_tokens']:,}"),
        ("prefill tokens, switch backs", f"{s['switch_back_prefill_tokens']:,}", f"{c['switch_back_prefill_tokens']:,}"),
        ("wall time, all requests (s)", f"{s['wall_s']:.1f}", f"{c['wall_s']:.1f}"),
        ("TTFT summed over switch backs (s)", f"{s['switch_back_ttft_s']:.1f}", f"{c['switch_back_ttft_s']:.1f}"),
        ("peak checkpoint memory (MiB, after a request)", _mb(s["peak_checkpoint_bytes"]), _mb(c["peak_checkpoint_bytes"])),
        ("captures / bytes they copied (MiB)", f"{s['captures']} / {_mb(s['captured_copied_bytes'])}",
         f"{c['captures']} / {_mb(c['captured_copied_bytes'])}"),
        ("captures skipped (the copy would not fit)", str(s["captures_skipped"]), str(c["captures_skipped"])),
        ("evictions from memory", str(s["evictions"]), str(c["evictions"])),
    ]
    for name, a, b in lines:
        print(f"| {name} | {a} | {b} |")


def run_sub_agents(args) -> int:
    model = Path(args.model).resolve()
    shape = QUICK if args.quick else FULL
    shape = Shape(args.system_tokens or shape.system_tokens, args.main_turn_tokens or shape.main_turn_tokens,
                  args.sub_turn_tokens or shape.sub_turn_tokens, args.agent_turns or shape.turns,
                  args.max_tokens or shape.max_tokens)
    for flag, value, least in (("--system-tokens", shape.system_tokens, 2), ("--main-turn-tokens", shape.main_turn_tokens, 4),
                               ("--sub-turn-tokens", shape.sub_turn_tokens, 4), ("--agent-turns", shape.turns, 2),
                               ("--max-tokens", shape.max_tokens, 1)):
        if value < least:   # a turn is <｜User｜> + content + <｜Assistant｜></think>; a switch back needs 2 turns
            raise SystemExit(f"{flag}: {value} is too small; at least {least}")
    context = int(json.loads((model / "config.json").read_text())["max_position_embeddings"])
    if longest_prompt(shape) + shape.max_tokens > context:
        raise SystemExit(f"shape: the main conversation's last prompt reaches {longest_prompt(shape)} tokens "
                         f"+ {shape.max_tokens} to generate, past the model's context ({context}); "
                         f"lower --main-turn-tokens or --agent-turns")
    vocab = Vocab.from_model_dir(model)
    turns = conversation_turns(vocab, shape)
    # The reply comes back as text; the client tokenizes it into its next prompt (the one tokenizer use)
    from cairn.daemon.protocol.tokenizer import TextTokenizer
    from cairn.daemon.weights.model_dir import open_model_dir
    tok = TextTokenizer.from_model_dir(open_model_dir(model))

    measure_n = 1024 if args.quick else 4096
    bpt = state_bytes_per_token(model, measure_n, args.threads)
    budget_mb = args.checkpoint_memory_mb or scaled_budget_mb(bpt["per_token"])
    print(f"state bytes per token: {bpt['per_token']:.0f} B (kernel State.nbytes / n at n = {bpt['n']}: "
          f"{bpt['nbytes']:,} B); each further token adds {bpt['slope']:.0f} B")
    print(f"checkpoint budget: {budget_mb} MiB" + (" (--checkpoint-memory-mb)" if args.checkpoint_memory_mb else
          f" = {DEFAULT_BUDGET_MB} MiB x {bpt['per_token']:.0f} / {FLASH_BYTES_PER_TOKEN:,} (the default, sized "
          f"for V4-Flash's {FLASH_BYTES_PER_TOKEN:,} B/token, scaled to this model's state)"))
    print(f"  (scaled by what each further token adds instead, the way 13,760 is counted: "
          f"{scaled_budget_mb(bpt['slope'])} MiB; pass --checkpoint-memory-mb to use it)")
    print(f"shape: system {shape.system_tokens}, main turns +{shape.main_turn_tokens}, sub-agent turns "
          f"+{shape.sub_turn_tokens}, {shape.turns} turns each, max_tokens {shape.max_tokens}; main's last "
          f"prompt <= {longest_prompt(shape)} tokens; slots {args.slots}, threads {args.threads}")
    print(f"load average at start: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}",
          flush=True)

    work = Path(tempfile.mkdtemp(prefix="cairn-subagents-"))
    common = ("--threads", str(args.threads), "--slots", str(args.slots), "--checkpoint-memory-mb", str(budget_mb),
              "--checkpoint-dir", str(work / "state"))
    daemons: dict[str, Daemon] = {}
    logs: dict[str, LogTail] = {}
    rows: dict[str, list[dict]] = {m: [] for m in MODES}
    load = [os.getloadavg()[0]]
    t_start = time.time()
    try:
        for mode in MODES:
            (work / mode).mkdir()
            log = work / mode / "daemon.log"
            daemons[mode] = Daemon(model, work / mode / "cairn.sock", log, *common,
                                   env={"CAIRN_CHECKPOINT_SHARE_PAGES": "true" if mode == "pages" else "false",
                                        "PYTHONUNBUFFERED": "1"})
            logs[mode] = LogTail(log)
            st = daemons[mode].client.get("/v1/status").json()
            plan = (st.get("memory") or {}).get("plan") or {}
            parts = plan.get("parts") or {}
            print(f"{mode}: checkpoint budget {_mb(st['checkpoints']['memory']['max_bytes'])} MiB; memory plan: "
                  f"largest capture copy (transients) {_mb(parts.get('transients') or 0)} MiB = a state at "
                  f"{plan.get('share_tokens')} tokens; {plan.get('slots')} slot(s)", flush=True)
        prompts = {m: {c: [] for c in CONVERSATIONS} for m in MODES}      # each mode's conversations so far
        origin: dict[str, dict[str, str]] = {m: {} for m in MODES}
        reply_len = {m: {c: 0 for c in CONVERSATIONS} for m in MODES}
        for i, (conv, t) in enumerate(schedule(shape.turns)):
            # both daemons get the same request back to back, first one then the other (alternating),
            # so load on the shared machine falls on both alike
            for mode in (MODES if i % 2 == 0 else MODES[::-1]):
                d, ids = daemons[mode], prompts[mode][conv]
                previous = len(ids) - (reply_len[mode][conv] if t > 0 else 0)   # its last prompt
                ids.extend(turns[conv][t])
                r = complete_ids(d, ids, shape.max_tokens)
                events = logs[mode].read()
                label = f"{conv} t{t}"
                stores = [e for e in events if e.get("event") == "checkpoint_store" and e.get("request_id") == r["rid"]]
                for e in stores:
                    origin[mode][e.get("id")] = f"{label} {e.get('kind')}"
                row = {"conv": conv, "turn": t, "switch_back": t > 0, "prompt": r["prompt"], "cached": r["cached"],
                       # of the conversation's previous prompt, the tokens not restored (computed again)
                       "recomputed": max(0, previous - r["cached"]) if t > 0 else 0,
                       "ttft": r["ttft"], "wall": r["wall"], "prompt_sha": hashlib.sha256(
                           np.asarray(ids, dtype=np.int32).tobytes()).hexdigest()[:16],
                       **classify(r["rid"], r["cached"], events, origin[mode]),
                       "captures": len(stores), "copied_bytes": sum(int(e.get("copied_bytes", 0)) for e in stores),
                       "skipped": [f"{e.get('kind')} at {e.get('tokens')}: {e.get('reason')}" for e in events
                                   if e.get("event") == "checkpoint_capture_skipped"
                                   and e.get("request_id") == r["rid"]],
                       "evictions": sum(1 for e in events if e.get("event") == "checkpoint_evict"
                                        and e.get("tier") == "memory"),
                       "checkpoint_bytes": int(d.client.get("/v1/status").json()["checkpoints"]["memory"]["bytes"])}
                rows[mode].append(row)
                # as an agent client sends the next turn: this prompt, the reply, its end of sentence
                reply = tok.encode(r["text"]) + [vocab.eos]
                reply_len[mode][conv] = len(reply)
                ids.extend(reply)
                print(f"  {mode:6s} {label:8s} prompt {row['prompt']:6d} cached {row['cached']:6d} "
                      f"{row['source']:6s} {row['from'] or '':34.34s} TTFT {row['ttft']:7.2f} s", flush=True)
                for why in row["skipped"]:
                    print(f"         capture skipped: {why}", flush=True)
            load.append(os.getloadavg()[0])
        final = {m: daemons[m].checkpoints() for m in MODES}
    finally:
        for d in daemons.values():
            d.stop()
        print(f"(daemon logs: {work}/pages/daemon.log, {work}/copies/daemon.log)")

    sums = {m: summarize(rows[m]) for m in MODES}
    for m in MODES:
        sums[m]["entries_at_end"] = len(final[m])
        sums[m]["own_bytes_at_end"] = sum(int(e.get("own_bytes", 0)) for e in final[m])
    same = [p["prompt_sha"] == c["prompt_sha"] for p, c in zip(rows["pages"], rows["copies"])]
    print_tables(rows, sums, budget_mb)
    print()
    print(f"same prompts in both modes: {'yes' if all(same) else 'no, first differs at request ' + str(same.index(False) + 1)}")
    goal = sums["pages"]["switch_backs_whole_from_memory"] == sums["pages"]["switch_backs"]
    print(f"goal (every switch back restores its whole previous prompt from memory in the paged run): "
          f"{'met' if goal else 'NOT met'}")
    print(f"wall clock {time.time() - t_start:.0f} s; load average (1 min) min {min(load):.2f} max {max(load):.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "shape": asdict(shape), "bytes_per_token": bpt, "checkpoint_memory_mb": budget_mb, "slots": args.slots,
            "rows": rows, "summary": sums, "same_prompts": all(same), "goal_met": goal,
            "load_average": {"min": min(load), "max": max(load)}}, indent=2))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/small")
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--system-tokens", type=int, default=None, help="default 8000 (--quick: 600)")
    ap.add_argument("--max-tokens", type=int, default=None, help="default 16 (--sub-agents: 8, --quick: 4)")
    ap.add_argument("--json", help="also write the results here")
    sub = ap.add_argument_group("--sub-agents: main + two sub-agents, pages vs full copies")
    sub.add_argument("--sub-agents", action="store_true", help="run this session instead of the demo")
    sub.add_argument("--quick", action="store_true", help="a tiny shape (3 turns, 600-token system prompt) for tests")
    sub.add_argument("--agent-turns", type=int, default=None, help="turns per conversation (default 10)")
    sub.add_argument("--main-turn-tokens", type=int, default=None, help="tokens each main turn adds (default 5700)")
    sub.add_argument("--sub-turn-tokens", type=int, default=None, help="tokens each sub-agent turn adds (default 1000)")
    sub.add_argument("--checkpoint-memory-mb", type=int, default=None,
                     help="checkpoint budget (default: 2048 MiB scaled by the state's bytes per token / 13,760)")
    sub.add_argument("--slots", type=int, default=1, help="daemon slots (default 1: every switch back needs a checkpoint)")
    sub.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.sub_agents:
        return run_sub_agents(args)
    args.system_tokens = args.system_tokens or 8000
    args.max_tokens = args.max_tokens or 16

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
