"""The per-token cost of constrained output (daemon/protocol/constrain.py): llguidance's mask, as decode uses it.

    python bench/grammar_mask.py models/small [--steps 2000] [--json out.json]
    python bench/grammar_mask.py --vocab 8192          # a make-model tokenizer of that size, no model

For three grammars (a JSON schema, `json_object`, a forced DSML tool call) a random walk samples
uniformly among the allowed tokens (restarting when the grammar ends) and times, per token:
`allowed()` (fill the bitmask, unpack it to a boolean row) + `accept()` (advance the matcher), and
the same `allowed()` through `trio.to_thread.run_sync`, as the decode actor calls it (the thread hop
included). The decode step of the model itself is in the kernel section above, for comparison.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import trio

SCHEMA = {"type": "object", "properties": {
    "verdict": {"type": "string", "enum": ["pass", "fail", "unsure"]},
    "score": {"type": "integer", "minimum": 0, "maximum": 100},
    "reasons": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 4},
    "fix": {"type": "object", "properties": {"file": {"type": "string", "maxLength": 60},
                                             "line": {"type": "integer"}}, "required": ["file"]}},
    "required": ["verdict", "score", "reasons"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "edit_file", "parameters": {"type": "object", "properties": {
    "path": {"type": "string", "maxLength": 80}, "line": {"type": "integer", "minimum": 1},
    "replace": {"type": "string", "maxLength": 200}, "dry_run": {"type": "boolean"}},
    "required": ["path", "line", "replace", "dry_run"]}}}]


def _tokenizer(args):
    from cairn.daemon.protocol.tokenizer import TextTokenizer

    if args.model is not None:
        from cairn.daemon.weights.model_dir import open_model_dir

        md = open_model_dir(args.model)
        return TextTokenizer.from_model_dir(md), int(md.config["vocab_size"])
    from cairn.daemon.modelgen.make_model import BOS, EOS, make_tokenizer

    return TextTokenizer(make_tokenizer(args.vocab), BOS, EOS), args.vocab


def _walk(grammars, grammar: str, tok, steps: int, seed: int) -> tuple[list[float], list[float]]:
    """Alternate steps: `allowed()` called directly, then through a worker thread (one trio run)."""
    rng = np.random.default_rng(seed)
    direct, hopped = [], []

    async def run():
        c = grammars.constraint(grammar, thinking=False)
        while len(direct) < steps:
            t0 = time.perf_counter()
            if len(hopped) < len(direct):
                allowed = await trio.to_thread.run_sync(c.allowed)
                where = hopped
            else:
                allowed = c.allowed()
                where = direct
            t1 = time.perf_counter()
            t = int(rng.choice(np.flatnonzero(allowed)))     # the walk's own choice: not timed
            t2 = time.perf_counter()
            if t != tok.eos_id:
                c.accept(t)
            where.append((t1 - t0) + (time.perf_counter() - t2))
            if t == tok.eos_id:                  # the grammar ended: start another reply
                c = grammars.constraint(grammar, thinking=False)

    trio.run(run)
    return direct, hopped


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path, nargs="?")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from cairn.daemon.protocol.dsv4.grammar import Dsv4Grammars as Grammars

    tok, vocab = _tokenizer(args)
    grammars = Grammars(tok.to_json(), vocab, tok.eos_id, tok)
    t0 = time.perf_counter()
    grammars.ll_tokenizer()
    setup_ms = (time.perf_counter() - t0) * 1000
    cases = {
        "json_schema": grammars.grammar_for(json_schema=SCHEMA, tool_choice="auto", tools=None),
        "json_object": grammars.grammar_for(json_schema={}, tool_choice="auto", tools=None),
        "forced tool call": grammars.grammar_for(json_schema=None, tool_choice={"function": {"name": "edit_file"}},
                                                 tools=TOOLS),
    }
    out = {"vocab": vocab, "llguidance_tokenizer_ms": round(setup_ms, 1), "cases": {}}
    print(f"vocab {vocab}; llguidance tokenizer built in {setup_ms:.0f} ms")
    print(f"{'grammar':18} {'compile ms':>10} {'mask+accept us p50':>19} {'p99':>8} {'via thread us p50':>18}")
    for name, grammar in cases.items():
        t0 = time.perf_counter()
        grammars.constraint(grammar, thinking=False)
        compile_ms = (time.perf_counter() - t0) * 1000
        direct, hopped = _walk(grammars, grammar, tok, args.steps, seed=0)
        us = sorted(x * 1e6 for x in direct)
        row = {"compile_ms": round(compile_ms, 2), "p50_us": round(statistics.median(us), 1),
               "p99_us": round(us[int(len(us) * 0.99)], 1),
               "thread_p50_us": round(statistics.median(x * 1e6 for x in hopped), 1)}
        out["cases"][name] = row
        print(f"{name:18} {row['compile_ms']:>10} {row['p50_us']:>19} {row['p99_us']:>8} {row['thread_p50_us']:>18}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
