"""An agent session on a Qwen3.5-MoE model at real attention and Gated DeltaNet width: cairn against
llama.cpp on the same GGUF and the same requests (issue 43 §5).

    .venv/bin/python bench/qwen35_session.py [--quick] [--json out.json] [--work /work/bench-qwen35agent]

The model: the preset `qwen35moe-agent` (daemon/modelgen/qwen35.py BENCH_PRESETS; Qwen3.5-35B-A3B's
widths: hidden 2048, attention 16 heads / 2 KV heads of 256 with partial RoPE 0.25, Gated DeltaNet 16 key
/ 32 value heads of 128, conv kernel 4; 8 layers, 3 GDN : 1 attention; 16 experts top-4 of width 64 + a
shared 64; vocabulary 8192; ~1.4 GB fp32), and its F32 GGUF by llama.cpp's own converter
(`Qwen3_5MoeTextModel`, pre-tokenizer `qwen35`). Both are built once under --work and reused.

One change to the preset's trained BPE, made here before the conversion so both files carry it: the
release's vocabulary has "\\n\\n" as one token (and so `<think>\\n\\n</think>\\n\\n`, the chat-mode
generation prompt, is 4 tokens); the trained one splits it in two (6). llama.cpp checkpoints a slot 4
tokens before each prompt's end, which with the release's tokens is exactly where the next turn's prompt
leaves this one (the template drops the think block of past turns); with 6 it would land 2 tokens past
that point and llama.cpp would fall back further for a reason that is the test model's, not its own.
The first unused filler id becomes "ĊĊ" with the merge `Ċ Ċ`.

The session (`schedule`): a ~3k-token system prompt; a main agent's 10 turns; two sub-agents A and B on
the same system prompt, 3 turns each, interleaved with the main agent after its second turn:
main0 main1 A0 B0 main2 A1 B1 main3 A2 B2 main4 main5 ... main9. Each turn sends a user message (a test
run's output, ~250 tokens for the main agent, ~150 for a sub-agent) and decodes 32 tokens (ignore_eos,
greedy); the next request carries the assistant's reply as a client sends it back. That reply is
scripted text, the same for both servers, so both get byte-identical requests (a random-weight model's
replies are noise, and they would differ between the two engines' numerics).

Alternation, per request: both servers are up the whole run, each warmed by one short unrelated
request first (weights paged in, experts touched); each request goes to one and then the other, cairn
first on even requests and llama.cpp first on odd ones, so drift in the shared machine's load falls on
both alike. Run it when the machine is quiet: with another process on one of the 2 cores, llama.cpp's
spinning thread pool slows down 10-20x on some requests (seen in --quick runs next to a test suite:
0.5-5 decode tok/s against ~22 alone) where cairn's slows far less; each row keeps the load average.

Both at their defaults, 2 threads, chat mode (`chat_template_kwargs.enable_thinking = false`):
- cairn: `cairn serve --threads 2` (checkpoints in memory, slots from its memory plan) on the same GGUF
  (--cairn-model dir: the safetensors directory it was converted from, the same weights bit for bit);
- llama.cpp: `llama-server -t 2 -tb 2 --jinja` (4 slots on one unified KV cache, a slot picked by the
  longest common prefix, f16 KV; context checkpoints on, up to 32 a slot: at a prompt's first and last
  user-message starts and 4 + ubatch and 4 tokens before its end; an 8 GiB prompt cache).

Per request and server (markdown table, and --json):
- new tokens: the prompt's tokens past the longest prefix it shares with this conversation's previous
  prompt (a sub-agent's first turn: with any earlier prompt, i.e. the system part). Prompts are rendered
  and tokenized here with cairn's renderer and the model's tokenizer; each server's own prompt count is
  checked against it;
- cached / computed: each server's own report (cairn: usage `cached_tokens` and its request log line;
  llama-server: `timings.cache_n` / `prompt_n`); recomputed = computed - new, the previous prompt's
  tokens prefilled again (the goal: 0 on every later turn and switch back);
- TTFT at the client (request sent to the first streamed token), both alike;
- prefill tok/s: computed tokens / the server's prompt time (llama: `prompt_ms`, from the slot's start
  to the first token; cairn: its request trace from the plan, restore included, to the first token);
- decode tok/s: (tokens - 1) / time from the first token to the last, both servers' own figure.

`--quick`: a 600-token system prompt, 4 main turns, 2 sub-agent turns each, 16 tokens a reply: checks the
whole path in ~3-4 minutes. The full run (the default) takes about 5-15 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "scripts"))

from agent_session import Daemon, LogTail, system_prompt  # noqa: E402
from llama_peer import _free_port, stop_process  # noqa: E402
from make_gguf_fixtures_qwen35 import convert_in_child  # noqa: E402

PRESET, SEED = "qwen35moe-agent", 0
NEWLINES = "ĊĊ"          # "\n\n" in byte-level BPE spelling


@dataclass(frozen=True)
class Shape:
    system_tokens: int       # the shared system prompt's text, about this many tokens
    main_turns: int
    sub_turns: int           # per sub-agent
    spawn_after: int         # the sub-agents start after this many main turns
    main_turn_tokens: int    # a main turn's user message, about
    sub_turn_tokens: int     # a sub-agent turn's user message, about
    max_tokens: int          # decoded per request (ignore_eos)


FULL = Shape(system_tokens=3000, main_turns=10, sub_turns=3, spawn_after=2, main_turn_tokens=250,
             sub_turn_tokens=150, max_tokens=32)
QUICK = Shape(system_tokens=600, main_turns=4, sub_turns=2, spawn_after=1, main_turn_tokens=80,
              sub_turn_tokens=50, max_tokens=16)
SUBS = ("A", "B")


def schedule(shape: Shape) -> list[tuple[str, int]]:
    """(conversation, turn) in request order: the main agent's first `spawn_after` turns, then each
    sub-agent turn round (A, B) followed by a main turn (it reads what they returned), then the rest
    of the main agent's turns."""
    plan = [("main", t) for t in range(min(shape.spawn_after, shape.main_turns))]
    main = len(plan)
    for s in range(shape.sub_turns):
        plan += [(c, s) for c in SUBS]
        if main < shape.main_turns:
            plan.append(("main", main))
            main += 1
    return plan + [("main", t) for t in range(main, shape.main_turns)]


def kind_of(conv: str, turn: int, previous: str | None) -> str:
    """'first' (a conversation's first turn), 'next' (the same conversation as the request before) or
    'switch back' (this conversation again after another one ran)."""
    if turn == 0:
        return "first"
    return "next" if previous == conv else "switch back"


def user_text(conv: str, turn: int, target: int, tok) -> str:
    """A test run's output as the user (tool) message: deterministic, about `target` tokens, its first
    words differ per conversation (so sub-agents share only the system part with the main agent)."""
    head = (f"Test run {turn} of the main task, after your last change:" if conv == "main" else
            f"Sub-agent {conv}, step {turn}: make the failing cases below pass, then report what you changed.")
    lines, k = [head], 0
    while len(tok.encode("\n".join(lines))) < target:
        lines.append(f"tests/test_{conv.lower()}_{turn}.py::test_case_{k} FAILED "
                     f"assert result == {(7 * k + turn) % 97}")
        k += 1
    return "\n".join(lines)


def reply_text(conv: str, turn: int) -> str:
    """The assistant's reply as the client sends it back: scripted, the same for both servers."""
    return (f"I read tests/test_{conv.lower()}_{turn}.py and the code it covers. The loop stopped one item "
            f"early, so I fixed its bound; the failing cases pass now and nothing else changed.")


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# ---- model and GGUF ---------------------------------------------------------------------------------

def release_newlines(model_dir: Path) -> bool:
    """Give "\\n\\n" one token, as the release's vocabulary does (module notes): the first unused filler id,
    right after the trained vocabulary (readers renumber a vocabulary with a gap), becomes "ĊĊ" with the
    merge `Ċ Ċ`. False if it was one token already."""
    path = model_dir / "tokenizer.json"
    tj = json.loads(path.read_text())
    model = tj["model"]
    if NEWLINES in model["vocab"]:
        return False
    fillers = [a for a in tj["added_tokens"] if a["content"].startswith("<｜unused")]
    if not fillers:
        raise SystemExit(f"{path}: no unused filler token to give to {NEWLINES!r}")
    first = min(fillers, key=lambda a: a["id"])
    if first["id"] != len(model["vocab"]):
        raise SystemExit(f"{path}: the first filler id {first['id']} does not follow the trained vocabulary")
    tj["added_tokens"].remove(first)
    model["vocab"][NEWLINES] = first["id"]
    pair = ["Ċ", "Ċ"] if isinstance(model["merges"][0], list) else "Ċ Ċ"
    model["merges"].append(pair)
    path.write_text(json.dumps(tj, ensure_ascii=False, indent=2) + "\n")
    return True


def build(work: Path, src: Path) -> tuple[Path, Path]:
    """The model directory and its F32 GGUF under `work`, made once."""
    model = work / PRESET
    gguf = work / f"{PRESET}.f32.gguf"
    if not (model / "config.json").exists():
        from cairn.daemon.modelgen.make_model import make_model
        from cairn.daemon.modelgen.qwen35 import BENCH_PRESETS

        print(f"making {model} (preset {PRESET}, seed {SEED})", flush=True)
        make_model(BENCH_PRESETS[PRESET], SEED, model)
        gguf.unlink(missing_ok=True)
    if release_newlines(model):
        print(f"{model}/tokenizer.json: '\\n\\n' is one token now (module notes)", flush=True)
        gguf.unlink(missing_ok=True)
    if not gguf.exists():
        print(f"converting {model} -> {gguf} (llama.cpp's converter)", flush=True)
        tmp = gguf.with_suffix(".partial")
        convert_in_child(src, model, tmp)   # the fixtures' converter: pre-tokenizer `qwen35`, --no-mtp, F32
        tmp.rename(gguf)
    return model, gguf


# ---- the two servers, one client -----------------------------------------------------------------------

def stream_chat(client: httpx.Client, body: dict) -> dict:
    """One streamed chat completion: the client's TTFT (the first chunk carrying generated text, reasoning
    or a tool call; else the finishing one), wall time, the response id, the final usage and, from
    llama-server, its timings."""
    t0 = time.perf_counter()
    ttft, rid, usage, timings, finish = None, None, {}, {}, None
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise SystemExit(f"HTTP {r.status_code}: {r.read().decode(errors='replace')[:2000]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue          # SSE comments are prefill progress, not tokens
            ev = json.loads(line[6:])
            rid = rid or ev.get("id")
            usage = ev.get("usage") or usage
            timings = ev.get("timings") or timings
            for ch in ev.get("choices", []):
                d = ch.get("delta") or {}
                if ttft is None and (d.get("content") or d.get("reasoning_content") or d.get("tool_calls")):
                    ttft = time.perf_counter() - t0
                finish = ch.get("finish_reason") or finish
                if ttft is None and finish:
                    ttft = time.perf_counter() - t0
    wall = time.perf_counter() - t0
    return {"rid": rid, "ttft": ttft if ttft is not None else wall, "wall": wall, "usage": usage,
            "timings": timings, "finish": finish}


def request_body(model_id: str, messages: list[dict], max_tokens: int) -> dict:
    return {"model": model_id, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True,
            "chat_template_kwargs": {"enable_thinking": False}}


class CairnSide:
    name = "cairn"

    def __init__(self, model: Path, work: Path, threads: int):
        work.mkdir(parents=True, exist_ok=True)
        log = work / "daemon.log"
        log.unlink(missing_ok=True)
        self.log = log
        # the last --threads wins over the one Daemon puts first
        self.daemon = Daemon(model, work / "cairn.sock", log, "--threads", str(threads), "--checkpoint-dir",
                             str(work / "state"), env={"PYTHONUNBUFFERED": "1"})
        self.tail = LogTail(log)
        self.command = f"cairn serve --model {model} --threads {threads} --checkpoint-dir {work / 'state'}"

    def request(self, messages: list[dict], max_tokens: int) -> dict:
        r = stream_chat(self.daemon.client, request_body(self.daemon.model_id, messages, max_tokens))
        line = self._request_line()
        trace = line.get("trace_ms") or {}
        # the prompt's time as llama-server counts it: from the plan (restore included) to the first token
        prompt_ms = sum(float(trace.get(k, 0)) for k in ("plan", "kernel", "snapshot", "prefill_other", "first_token"))
        usage = r["usage"]
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
        n = int(line.get("completion_tokens") or usage.get("completion_tokens") or 0)
        return {"ttft": r["ttft"], "wall": r["wall"], "prompt": int(usage.get("prompt_tokens", 0)), "cached": cached,
                "computed": int(line.get("computed_tokens", int(usage.get("prompt_tokens", 0)) - cached)),
                "prompt_ms": prompt_ms, "completion": n,
                "decode_ms": (n - 1) / line["decode_tok_s"] * 1e3 if line.get("decode_tok_s") else 0.0,
                "server_ttft_ms": line.get("ttft_ms")}

    def _request_line(self) -> dict:
        """The daemon's one log line per request (actors/engine/outcome.py); requests run one at a time,
        so it is the newest; the line can trail the stream's end by a moment."""
        deadline = time.monotonic() + 10
        while True:
            lines = [e for e in self.tail.read() if e.get("event") == "request"]
            if lines:
                return lines[-1]
            if time.monotonic() > deadline:
                raise SystemExit(f"no request line in {self.log}")
            time.sleep(0.05)

    def stop(self) -> None:
        self.daemon.stop()


class LlamaSide:
    name = "llama.cpp"

    def __init__(self, src: Path, gguf: Path, work: Path, threads: int, extra: list[str]):
        exe = src / "build" / "bin" / "llama-server"
        if not os.access(exe, os.X_OK):
            raise SystemExit(f"{exe} is missing: build it with ../shared/tools/llama-peer/build.sh")
        read_through(gguf)
        work.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        self.cmd = [str(exe), "-m", str(gguf), "-t", str(threads), "-tb", str(threads), "--jinja",
                    "--host", "127.0.0.1", "--port", str(self.port), *extra]
        self.command = " ".join(["llama-server", *self.cmd[1:]])
        self.logf = open(work / "llama-server.log", "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self.logf, stderr=subprocess.STDOUT)
        # a new connection per request: llama-server may close an idle kept-alive one under the client
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=httpx.Timeout(1800.0),
                                   limits=httpx.Limits(max_keepalive_connections=0))
        deadline = time.monotonic() + 300
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"llama-server exited ({self.proc.returncode}); see {work / 'llama-server.log'}")
            try:
                if self.client.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"llama-server not ready after 300 s; see {work / 'llama-server.log'}")
            time.sleep(0.5)

    def request(self, messages: list[dict], max_tokens: int) -> dict:
        r = stream_chat(self.client, request_body("gguf", messages, max_tokens))
        t = r["timings"]
        if not t:
            raise SystemExit("llama-server sent no timings")
        return {"ttft": r["ttft"], "wall": r["wall"], "prompt": int(t["prompt_n"]) + int(t["cache_n"]),
                "cached": int(t["cache_n"]), "computed": int(t["prompt_n"]), "prompt_ms": float(t["prompt_ms"]),
                "completion": int(t["predicted_n"]), "decode_ms": float(t["predicted_ms"]), "server_ttft_ms": None}

    def stop(self) -> None:
        stop_process(self.proc)
        self.logf.close()


def read_through(path: Path) -> None:
    """Read a file once so it starts in the page cache: llama-server maps its GGUF and pages the weights
    in as tokens touch them; this machine pages out file cache left unmapped for a minute, so a GGUF
    written or read earlier would otherwise be read from disk during the first requests."""
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


WARM_UP = [{"role": "user", "content": "Warm up: " + " ".join(f"word{i}" for i in range(60))}]


def start_cairn(choice: str, model_dir: Path, gguf: Path, work: Path, threads: int) -> tuple[CairnSide, str]:
    """cairn on the GGUF (`gguf`, the default: the file llama.cpp serves), the directory it was converted
    from (`dir`: the same weights bit for bit), or a path. Returns the side and a note saying which."""
    path = {"gguf": gguf, "dir": model_dir}.get(choice, Path(choice))
    return CairnSide(path, work, threads), f"the {'safetensors directory' if path == model_dir else 'GGUF' if path == gguf else 'model'} {path}"


# ---- the run -------------------------------------------------------------------------------------------

def summarize(rows: list[dict]) -> dict:
    later = [r for r in rows if r["kind"] != "first"]
    subs_first = [r for r in rows if r["kind"] == "first" and r["conv"] != "main"]
    decoded = [r for r in rows if r["completion"] > 1 and r["decode_ms"] > 0]

    def med(xs):
        return statistics.median(xs) if xs else 0.0

    return {
        "requests": len(rows),
        "later_and_switch_backs": len(later),
        "whole_previous_prompt_restored": sum(r["recomputed"] == 0 for r in later),
        "recomputed_tokens_later": sum(r["recomputed"] for r in later),
        "recomputed_tokens_sub_agent_first": sum(r["recomputed"] for r in subs_first),
        "computed_tokens": sum(r["computed"] for r in rows),
        "ttft_cold_s": rows[0]["ttft"],
        "ttft_median_later_s": med([r["ttft"] for r in later]),
        "ttft_sum_later_s": sum(r["ttft"] for r in later),
        "ttft_sum_s": sum(r["ttft"] for r in rows),
        "prefill_tok_s_cold": rows[0]["computed"] / (rows[0]["prompt_ms"] / 1e3) if rows[0]["prompt_ms"] else 0.0,
        "prefill_tok_s_all": (sum(r["computed"] for r in rows) / (sum(r["prompt_ms"] for r in rows) / 1e3)
                              if sum(r["prompt_ms"] for r in rows) else 0.0),
        "decode_tok_s_all": (sum(r["completion"] - 1 for r in decoded) / (sum(r["decode_ms"] for r in decoded) / 1e3)
                             if decoded else 0.0),
        "decode_tok_s_median": med([(r["completion"] - 1) / (r["decode_ms"] / 1e3) for r in decoded]),
        "prompt_mismatches": sum(r["prompt"] != r["prompt_expected"] for r in rows),
    }


def print_tables(rows: dict[str, list[dict]], sums: dict[str, dict]) -> None:
    names = list(rows)
    print()
    print("| # | turn | kind | who | prompt | new | cached | computed | recomputed | TTFT s | prefill tok/s | "
          "decode tok/s |")
    print("|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for i in range(len(rows[names[0]])):
        for who in names:
            r = rows[who][i]
            pf = f"{r['computed'] / (r['prompt_ms'] / 1e3):.0f}" if r["prompt_ms"] > 0 else "-"
            decoded = r["decode_ms"] > 0 and r["completion"] > 1
            dc = f"{(r['completion'] - 1) / (r['decode_ms'] / 1e3):.1f}" if decoded else "-"
            print(f"| {i + 1} | {r['conv']}{r['turn']} | {r['kind']} | {who} | {r['prompt']} | {r['new']} | "
                  f"{r['cached']} | {r['computed']} | {r['recomputed']} | {r['ttft']:.2f} | {pf} | {dc} |")
    print()
    print("| | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    lines = [
        ("later turns and switch backs restoring the whole previous prompt",
         lambda s: f"{s['whole_previous_prompt_restored']} / {s['later_and_switch_backs']}"),
        ("tokens recomputed, later turns and switch backs", lambda s: f"{s['recomputed_tokens_later']:,}"),
        ("tokens recomputed, sub-agents' first turns (beyond the shared prefix)",
         lambda s: f"{s['recomputed_tokens_sub_agent_first']:,}"),
        ("prompt tokens computed, all requests", lambda s: f"{s['computed_tokens']:,}"),
        ("TTFT, first request (cold) (s)", lambda s: f"{s['ttft_cold_s']:.2f}"),
        ("TTFT median, later turns and switch backs (s)", lambda s: f"{s['ttft_median_later_s']:.2f}"),
        ("TTFT summed, later turns and switch backs (s)", lambda s: f"{s['ttft_sum_later_s']:.1f}"),
        ("prefill tok/s, first request (cold)", lambda s: f"{s['prefill_tok_s_cold']:.1f}"),
        ("prefill tok/s, all requests (computed / prompt time)", lambda s: f"{s['prefill_tok_s_all']:.1f}"),
        ("decode tok/s, all requests (steps / decode time)", lambda s: f"{s['decode_tok_s_all']:.1f}"),
        ("decode tok/s, median request", lambda s: f"{s['decode_tok_s_median']:.1f}"),
        ("prompt length differs from the client's rendering", lambda s: str(s["prompt_mismatches"])),
    ]
    for name, f in lines:
        print(f"| {name} | " + " | ".join(f(sums[n]) for n in names) + " |")


def run(args) -> int:
    from cairn.daemon.protocol.chat_encoding import ChatOptions
    from cairn.daemon.protocol.qwen35.render import Qwen35Renderer
    from cairn.daemon.protocol.tokenizer import TextTokenizer
    from cairn.daemon.weights.model_dir import open_model_dir
    from make_gguf_fixtures import llama_cpp_source

    shape = QUICK if args.quick else FULL
    overrides = {k: v for k, v in (("system_tokens", args.system_tokens), ("main_turns", args.turns),
                                   ("max_tokens", args.max_tokens)) if v}
    shape = Shape(**{**asdict(shape), **overrides})
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    src = llama_cpp_source(args.llama_cpp)
    model_dir, gguf = build(work, src)

    md = open_model_dir(model_dir)
    tok = TextTokenizer.from_model_dir(md)
    renderer = Qwen35Renderer.from_model_dir(md)
    chat = ChatOptions(thinking=False)
    system = system_prompt(shape.system_tokens, tok)
    plan = schedule(shape)
    print(f"shape: {asdict(shape)}; {len(plan)} requests: {' '.join(f'{c}{t}' for c, t in plan)}")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)

    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    sides: dict[str, object] = {}
    load = [os.getloadavg()[0]]
    t_start = time.time()
    try:
        sides["cairn"], cairn_note = start_cairn(args.cairn_model, model_dir, gguf, run_dir / "cairn", args.threads)
        sides["llama.cpp"] = LlamaSide(src, gguf, run_dir / "llama", args.threads, args.llama_arg or [])
        for side in sides.values():
            # one short unrelated request each (no prefix shared with the session past the chat markup):
            # every weight page and expert touched once before anything is timed
            side.request(WARM_UP, 8)
        print(f"cairn serves {cairn_note}")
        print(f"cairn: {sides['cairn'].command}")
        print(f"llama.cpp: {sides['llama.cpp'].command}", flush=True)
        convs = {c: [{"role": "system", "content": system}] for c in ("main", *SUBS)}
        last_ids: dict[str, list[int]] = {}
        earlier: list[list[int]] = []
        rows: dict[str, list[dict]] = {n: [] for n in sides}
        previous = None
        for i, (conv, turn) in enumerate(plan):
            msgs = convs[conv]
            msgs.append({"role": "user", "content": user_text(
                conv, turn, shape.main_turn_tokens if conv == "main" else shape.sub_turn_tokens, tok)})
            rendered = renderer.render(msgs, options=chat)
            ids = tok.encode(rendered.text, rendered.content_spans)
            base = [last_ids[conv]] if conv in last_ids else earlier
            shared = max((common_prefix(ids, p) for p in base), default=0)
            kind = kind_of(conv, turn, previous)
            for name in (list(sides) if i % 2 == 0 else list(sides)[::-1]):
                r = sides[name].request(msgs, shape.max_tokens)
                new = r["prompt"] - shared
                row = {"conv": conv, "turn": turn, "kind": kind, "prompt_expected": len(ids), "new": new,
                       "recomputed": max(0, r["computed"] - new), "load": round(os.getloadavg()[0], 2), **r}
                rows[name].append(row)
                print(f"  {i + 1:2d} {conv}{turn:<2d} {kind:11s} {name:9s} prompt {r['prompt']:5d} new {new:4d} "
                      f"cached {r['cached']:5d} computed {r['computed']:5d} recomputed {row['recomputed']:5d} "
                      f"TTFT {r['ttft']:6.2f} s", flush=True)
            msgs.append({"role": "assistant", "content": reply_text(conv, turn)})
            last_ids[conv] = ids
            earlier.append(ids)
            previous = conv
            load.append(os.getloadavg()[0])
    finally:
        for s in sides.values():
            s.stop()
        print(f"(logs: {run_dir})")

    sums = {n: summarize(rows[n]) for n in rows}
    print_tables(rows, sums)
    c, l = sums["cairn"], sums["llama.cpp"]
    ratio = {k: (c[k] / l[k] if l[k] else 0.0) for k in ("prefill_tok_s_cold", "prefill_tok_s_all", "decode_tok_s_all")}
    print()
    print(f"cairn / llama.cpp: prefill {ratio['prefill_tok_s_cold']:.2f}x cold, {ratio['prefill_tok_s_all']:.2f}x "
          f"over all requests; decode {ratio['decode_tok_s_all']:.2f}x")
    restores = c["whole_previous_prompt_restored"] == c["later_and_switch_backs"]
    print(f"goal: cairn restores the whole previous prompt on every later turn and switch back: "
          f"{'met' if restores else 'NOT met'} ({c['whole_previous_prompt_restored']} / "
          f"{c['later_and_switch_backs']}); "
          f"llama.cpp recomputes on {l['later_and_switch_backs'] - l['whole_previous_prompt_restored']} of them "
          f"({l['recomputed_tokens_later']:,} tokens); prefill and decode >= llama.cpp: "
          f"{'met' if min(ratio['prefill_tok_s_all'], ratio['decode_tok_s_all']) >= 1 else 'NOT met'}")
    print(f"cairn served {cairn_note}")
    print(f"wall clock {time.time() - t_start:.0f} s; load average (1 min) min {min(load):.2f} max {max(load):.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "shape": asdict(shape), "schedule": [f"{c}{t}" for c, t in plan], "cairn_model": cairn_note,
            "commands": {n: s.command for n, s in sides.items()}, "rows": rows, "summary": sums, "ratio": ratio,
            "goal_restores": restores, "load_average": {"min": min(load), "max": max(load)}}, indent=2))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="/work/bench-qwen35agent",
                    help="where the model, its GGUF and each run's logs live (outside the repository)")
    ap.add_argument("--quick", action="store_true", help="a short session to check the path end to end")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--cairn-model", default="gguf",
                    help="gguf (the file llama.cpp serves), dir (the directory it was converted from), or a path")
    ap.add_argument("--llama-cpp", help="llama.cpp source tree with build/bin/llama-server "
                                        "(default: the llama-cpp-python sdist's under ~/.cache/llama-peer)")
    ap.add_argument("--llama-arg", action="append",
                    help="one more llama-server argument (repeat; e.g. --llama-arg=-np --llama-arg=1)")
    ap.add_argument("--threads", type=int, default=2, help="threads of each server (default 2)")
    ap.add_argument("--system-tokens", type=int, help="default 3000 (--quick: 600)")
    ap.add_argument("--turns", type=int, help="main agent turns (default 10; --quick: 4)")
    ap.add_argument("--max-tokens", type=int, help="decoded per request (default 32; --quick: 16)")
    return run(ap.parse_args())


if __name__ == "__main__":
    sys.exit(main())
