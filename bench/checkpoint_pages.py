"""Checkpoints as page references against full copies, side by side in one run, on the kernel directly.

    .venv/bin/python bench/checkpoint_pages.py --model models/small --threads 2 --json pages.json
    .venv/bin/python bench/checkpoint_pages.py --quick            # a generated tiny model, seconds

For each length N (--lengths): one state is prefilled to N (extended from the previous length, never
restarted), then each mode gets its own copy of it and runs the same simulated conversation: append
--turn-offset tokens and capture (turn 0, the prompt end), then --turns times append --turn-tokens
tokens and capture. Modes: `full` = `snapshot(share_pages=False)` (every page group copied: what a
checkpoint cost before pages), `pages` = `snapshot(share_pages=True)` (the tail copied, groups shared).
Every capture is kept, as a checkpoint store would keep them.

Per turn (turns 1.., medians):
  capture bytes  what the store newly holds: full = `nbytes` (everything again); pages =
                 `copied_nbytes` + the groups whose ids the previous turn's snapshot does not hold
                 (the partial group the live state copied on write counts as new).
  on disk        the same as stored in files: the tail blob + the full pages not stored before
                 (the partial group's rows travel in the tail).
  bound          the issue's: 2 x (turn tokens x bytes per token) + tail, bytes per token =
                 state.nbytes / n_tokens at the capture, tail = `own_nbytes`.
  capture        time of `snapshot()`, best of --repeat; turn prefill: the append before it (once;
                 in pages mode it includes copying the partial group the previous snapshot shares).
  restore        `State.restore(model, snap)`, then decode steps on the restored state, timed one
                 by one, best of --repeat fresh restores: the first step, the first step that
                 writes a compressed row (the restored state shares the snapshot's partial group,
                 so that write copies it: copy on write), and the next step where the same
                 compressors write (the same work without the copy). --turn-offset 99 (default)
                 puts every capture mid-page with n = 3 mod 4, so the first decode is the copying
                 one. In both modes a restore shares the snapshot's groups (a full snapshot's are
                 its own copies), so both copy on write; a restore that copies everything, as
                 before pages, is the from_bytes column below.
  pool           `page_pool()` after the turns (live state + every capture alive), and its growth
                 over the state the mode started from.
The two modes run turn by turn, alternating which goes first, so load on a shared machine hits both.

Then, per length, a restore from serialized parts (what a disk restore costs after reading the
files): `Snapshot.from_parts(model, tail, pages)` on bytes copies of the last pages capture's tail
and full pages, and `Snapshot.from_bytes` on its one-blob form, best of --repeat. Outputs of both
modes and of the rebuilt snapshot are compared bit for bit (`identical`).

Prints markdown tables (progress on stderr) and writes JSON (--json).
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
from pathlib import Path

import numpy as np

PROGRESS_EVERY = 8192  # tokens between progress lines while a long state is built


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def machine() -> dict:
    """CPU model (lscpu) and the vector flags the kernel's micro-kernels choose between."""
    out = {"cpu": "", "avx512f": False, "avx2": False, "nproc": os.cpu_count()}
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        text = ""
    for line in text.splitlines():
        key, _, val = line.partition(":")
        if key.strip() == "Model name":
            out["cpu"] = val.strip()
        elif key.strip() == "Flags":
            flags = set(val.split())
            out["avx512f"], out["avx2"] = "avx512f" in flags, "avx2" in flags
    return out


def row_rates(config: dict) -> list[int]:
    """Compress rates of the layers that write compressed rows (pages); empty if none does."""
    rates = []
    for lt in config["layer_types"]:
        if lt == "compressed_sparse_attention":
            rates.append(int(config["csa_rate"]))
        elif lt == "heavily_compressed_attention":
            rates.append(int(config["hca_rate"]))
    return sorted(set(rates))


def first_row_step(n: int, rates: list[int]) -> int | None:
    """The 1-based decode step from a state of n tokens that first writes a compressed row
    (step i leaves n + i tokens; a compressor of rate r writes when that is a multiple of r)."""
    return min((r - n % r) for r in rates) if rates else None


def row_steps(n: int, rates: list[int]) -> tuple[int | None, int | None]:
    """(the first row-writing step, the next step after it where the same compressors write): the
    second does the first's work on a group that is already private, the reference for its copy."""
    cow = first_row_step(n, rates)
    if cow is None:
        return None, None
    writers = lambda s: {r for r in rates if (n + s) % r == 0}   # noqa: E731
    ref = next((s for s in range(cow + 1, cow + 33) if writers(s) == writers(cow)), None)
    return cow, ref


def extend(K, st, toks: np.ndarray, chunk: int, label: str) -> float:
    """Prefill toks into st in pieces, printing progress; returns seconds."""
    t0 = time.perf_counter()
    for a in range(0, len(toks), PROGRESS_EVERY):
        K.prefill(st, toks[a:a + PROGRESS_EVERY], chunk=chunk)
        dt = time.perf_counter() - t0
        log(f"{label}: {st.n_tokens} tokens, {min(a + PROGRESS_EVERY, len(toks)) / dt:.1f} tok/s, {dt:.1f} s")
    return time.perf_counter() - t0


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def restore_and_decode(K, model, snap, token: int, rates: list[int], repeat: int) -> dict:
    """Restore, then decode up to the row-writing step after the copy-on-write one, each step timed;
    best of `repeat` fresh restores (each copies the shared partial group again on its first write:
    contention on a shared machine only ever slows a step down). Logits must agree across repeats."""
    cow, ref = row_steps(snap.n_tokens, rates)
    best_restore, best_steps, first = float("inf"), None, None
    for _ in range(repeat):
        restore_s, st = timed(lambda: K.State.restore(model, snap))
        steps, logits, tok, grew = [], [], token, []
        for _ in range(ref or cow or 1):
            g0 = K.page_pool()["groups"]
            dt, lg = timed(lambda: K.decode(st, tok))
            grew.append(K.page_pool()["groups"] - g0)   # the copy-on-write step makes one group
            steps.append(dt)
            logits.append(lg)
            tok = int(lg.argmax())
        del st
        best_restore = min(best_restore, restore_s)
        best_steps = steps if best_steps is None else [min(a, b) for a, b in zip(best_steps, steps)]
        if first is None:
            first = logits
        elif not all(np.array_equal(a, b) for a, b in zip(first, logits)):
            raise AssertionError(f"restores of one snapshot at {snap.n_tokens} tokens decoded different logits")
    return {"token": token, "restore_s": best_restore, "first_decode_s": best_steps[0],
            "cow_step": cow, "cow_decode_s": best_steps[cow - 1] if cow else None,
            "row_decode_s": best_steps[ref - 1] if ref else None, "decode_steps_s": best_steps,
            "decode_steps_new_groups": grew,
            "_logits": first[0]}


class ModeRun:
    """One mode's copy of the state and every capture it took (alive, as in a store)."""

    def __init__(self, K, model, base_snap, mode: str):
        self.K, self.model, self.mode, self.share = K, model, mode, mode == "pages"
        self.st = K.State.restore(model, base_snap)      # both modes start from the same state
        self.caps: list[dict] = []
        self.keep: list = []
        self.prev_ids: set[int] = set()
        self.prev_full: set[int] = set()

    def turn(self, toks: np.ndarray, chunk: int, rates: list[int], repeat: int) -> None:
        K, st, share = self.K, self.st, self.share
        prefill_s = timed(lambda: K.prefill(st, toks, chunk=chunk))[0] if len(toks) else 0.0
        # best of `repeat` captures (the others are dropped at once: they copied or shared the same)
        capture_s = min((timed(lambda: st.snapshot(share_pages=share))[0] for _ in range(repeat - 1)),
                        default=float("inf"))
        dt, snap = timed(lambda: st.snapshot(share_pages=share))
        capture_s = min(capture_s, dt)
        self.keep.append(snap)
        ids = [int(i) for i in snap.page_ids]
        full_ids = set(ids[:snap.n_full_pages])
        new_groups = [i for i in ids if i not in self.prev_ids]
        new_full = full_ids - self.prev_full
        bpt = st.nbytes / st.n_tokens              # at this capture's length
        cap = {
            "turn": len(self.caps), "n_tokens": snap.n_tokens, "prefill_s": prefill_s, "capture_s": capture_s,
            "copied_nbytes": snap.copied_nbytes, "own_nbytes": snap.own_nbytes, "nbytes": snap.nbytes,
            "new_groups": len(new_groups),
            "capture_bytes": snap.nbytes if not share else snap.copied_nbytes + len(new_groups) * snap.page_nbytes,
            "disk_bytes": len(snap.tail()) + (snap.n_full_pages if not share else len(new_full)) * snap.page_nbytes,
            "state_nbytes": st.nbytes, "bytes_per_token": bpt,
            "bound_bytes": 2 * len(toks) * bpt + snap.own_nbytes,
        }
        cap.update(restore_and_decode(K, self.model, snap, int(st.last_logits.argmax()), rates, repeat))
        self.caps.append(cap)
        self.prev_ids, self.prev_full = set(ids), full_ids

    def summary(self) -> dict:
        out = {"mode": self.mode, "turns": self.caps}
        later = self.caps[1:] or self.caps
        for key in ("capture_bytes", "disk_bytes", "bound_bytes", "capture_s", "prefill_s", "restore_s",
                    "first_decode_s", "cow_decode_s", "row_decode_s"):
            vals = [c[key] for c in later if c[key] is not None]
            out[key] = statistics.median(vals) if vals else None
        return out


def run_turns(K, model, base_snap, turn_toks: list[np.ndarray], chunk: int, rates: list[int],
              repeat: int, n: int) -> tuple[dict, dict]:
    """Both modes, turn by turn, alternating which goes first (a busy minute hits both alike).
    Returns their summaries and what the rest of the run needs from them."""
    pool0 = K.page_pool()["bytes"]
    runs = {m: ModeRun(K, model, base_snap, m) for m in ("full", "pages")}
    for t, toks in enumerate(turn_toks):
        for m in (("full", "pages") if t % 2 == 0 else ("pages", "full")):
            runs[m].turn(toks, chunk, rates, repeat)
        log(f"{n}: turn {t} captured at {runs['full'].st.n_tokens} tokens")
    both = K.page_pool()["bytes"]
    out = {m: r.summary() for m, r in runs.items()}
    same = bool(np.array_equal(runs["full"].st.last_logits, runs["pages"].st.last_logits) and all(
        np.array_equal(a["_logits"], b["_logits"]) for a, b in zip(runs["full"].caps, runs["pages"].caps)))
    last_snap, last_cap = runs["pages"].keep[-1], dict(runs["pages"].caps[-1])
    # The modes share only the base's groups, so dropping full's objects leaves base + pages in
    # the pool: each mode's growth over the base is exact (page_pool counts the process).
    del runs["full"]
    pages_pool = K.page_pool()["bytes"]
    out["pages"]["pool_bytes"], out["pages"]["pool_growth_bytes"] = pages_pool, pages_pool - pool0
    out["full"]["pool_bytes"], out["full"]["pool_growth_bytes"] = pool0 + both - pages_pool, both - pages_pool
    for m in out.values():
        for c in m["turns"]:
            c.pop("_logits")
    return out, {"identical": same, "last_snap": last_snap, "last_logits": last_cap["_logits"],
                 "last_token": last_cap["token"]}


def from_parts_row(K, model, snap, repeat: int, restored_logits: np.ndarray, token: int) -> dict:
    """Rebuild the snapshot from serialized bytes, as a disk restore does after reading its files."""
    tail = snap.tail()
    pages = [bytes(snap.page(k)) for k in range(snap.n_full_pages)]   # private copies, as read
    blob = snap.to_bytes()
    parts_s = min(timed(lambda: K.Snapshot.from_parts(model, tail, pages))[0] for _ in range(repeat))
    bytes_s = min(timed(lambda: K.Snapshot.from_bytes(model, blob))[0] for _ in range(repeat))
    rebuilt = K.Snapshot.from_parts(model, tail, pages)
    same = bool(np.array_equal(K.decode(K.State.restore(model, rebuilt), token), restored_logits))
    return {"tail_bytes": len(tail), "full_pages": len(pages), "pages_bytes": sum(map(len, pages)),
            "from_parts_s": parts_s, "from_bytes_s": bytes_s, "blob_bytes": len(blob), "identical": same}


def run(args) -> dict:
    from cairn import _kernel as K
    from cairn.daemon.weights.model_dir import load_model, open_model_dir

    md = open_model_dir(args.model)
    rates = row_rates(md.config)
    t0 = time.perf_counter()
    model = load_model(md, args.threads)
    res = {"model": str(args.model), "threads": args.threads, "chunk": args.chunk,
           "turn_tokens": args.turn_tokens, "turns": args.turns, "turn_offset": args.turn_offset,
           "lengths": args.lengths, "page_tokens": model.page_tokens, "page_nbytes": model.page_nbytes,
           "row_rates": rates, "load_s": time.perf_counter() - t0, "machine": machine(),
           "load_avg_start": os.getloadavg(), "rows": []}
    log(f"loaded {args.model} in {res['load_s']:.1f} s; page group {model.page_tokens} tokens, "
        f"{model.page_nbytes / 1e3:.1f} kB; load average {os.getloadavg()[0]:.2f}")
    vocab = int(model.vocab_size)
    prompt = np.random.default_rng(args.seed).integers(0, vocab, max(args.lengths), dtype=np.int32)
    base = K.State(model)
    for n in args.lengths:
        build_s = extend(K, base, prompt[base.n_tokens:n], args.chunk, f"build to {n}")
        rng = np.random.default_rng([args.seed, n])
        turn_toks = [rng.integers(0, vocab, args.turn_offset, dtype=np.int32)] + \
                    [rng.integers(0, vocab, args.turn_tokens, dtype=np.int32) for _ in range(args.turns)]
        base_snap = base.snapshot()
        row = {"n": n, "build_s": build_s, "state_nbytes": base.nbytes, "load_avg": os.getloadavg()[0]}
        modes, keep = run_turns(K, model, base_snap, turn_toks, args.chunk, rates, args.repeat, n)
        row["from_parts"] = from_parts_row(K, model, keep["last_snap"], args.repeat, keep["last_logits"],
                                           keep["last_token"])
        row["identical"] = keep["identical"] and row["from_parts"]["identical"]
        del keep
        row["modes"] = modes
        res["rows"].append(row)
        del base_snap
    res["load_avg_end"] = os.getloadavg()
    return res


def tables(res: dict) -> str:
    mb = lambda b: f"{b / 1e6:.2f}"           # noqa: E731
    ms = lambda s: "—" if s is None else f"{s * 1e3:.2f}"   # noqa: E731
    out = [f"{res['model']}, {res['threads']} threads, chunk {res['chunk']}, page group "
           f"{res['page_tokens']} tokens = {res['page_nbytes'] / 1e3:.1f} kB, turns of {res['turn_tokens']} "
           f"tokens x {res['turns']} after {res['turn_offset']}; medians over turns 1..{res['turns']}", "",
           "| N | mode | capture / turn MB | on disk / turn MB | bound MB | of bound | capture ms | turn prefill s "
           "| restore ms | 1st decode ms | COW decode ms | row decode ms | pool after turns MB (growth) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        for mode in ("full", "pages"):
            m = r["modes"][mode]
            out.append(f"| {r['n']} | {mode} | {mb(m['capture_bytes'])} | {mb(m['disk_bytes'])} | "
                       f"{mb(m['bound_bytes'])} | {m['capture_bytes'] / m['bound_bytes']:.2f}× | "
                       f"{ms(m['capture_s'])} | {m['prefill_s']:.2f} | {ms(m['restore_s'])} | "
                       f"{ms(m['first_decode_s'])} | {ms(m['cow_decode_s'])} | {ms(m['row_decode_s'])} | "
                       f"{mb(m['pool_bytes'])} (+{mb(m['pool_growth_bytes'])}) |")
    out += ["", "| N | state MB | build s | tail MB | full pages | pages MB | from_parts ms | GB/s "
            "| from_bytes ms | identical |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        fp = r["from_parts"]
        total = fp["tail_bytes"] + fp["pages_bytes"]
        out.append(f"| {r['n']} | {mb(r['state_nbytes'])} | {r['build_s']:.1f} | {mb(fp['tail_bytes'])} | "
                   f"{fp['full_pages']} | {mb(fp['pages_bytes'])} | {ms(fp['from_parts_s'])} | "
                   f"{total / 1e9 / max(fp['from_parts_s'], 1e-9):.2f} | {ms(fp['from_bytes_s'])} | "
                   f"{'yes' if r['identical'] else '**NO**'} |")
    return "\n".join(out)


def parse_lengths(text: str) -> list[int]:
    try:
        vals = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--lengths must be comma-separated integers, got {text!r}") from None
    if not vals or vals[0] < 1:
        raise argparse.ArgumentTypeError(f"--lengths must be positive token counts, got {text!r}")
    return vals


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="model directory (required unless --quick)")
    ap.add_argument("--lengths", type=parse_lengths, help="comma-separated state lengths "
                    "(default 8192,32768,131072; --quick: 512,2048)")
    ap.add_argument("--turn-tokens", type=int, default=512)
    ap.add_argument("--turns", type=int, help="captured turns after the first capture (default 3; --quick: 2)")
    ap.add_argument("--turn-offset", type=int, default=99,
                    help="tokens appended before the first capture (99: captures mid-page; 0: page-aligned)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=512, help="prefill chunk (1..512)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="best of this many captures, restores (+ decode steps), from_parts and from_bytes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true",
                    help="lengths 512,2048, 2 turns; without --model, on a tiny model generated in a temp dir")
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args(argv)
    if args.lengths is None:
        args.lengths = [512, 2048] if args.quick else [8192, 32768, 131072]
    if args.turns is None:
        args.turns = 2 if args.quick else 3
    for name in ("turn_tokens", "turns", "repeat"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not 1 <= args.chunk <= 512:
        ap.error(f"--chunk must be in 1..512 (the kernel's largest chunk), got {args.chunk}")
    if args.turn_offset < 0:
        ap.error(f"--turn-offset must be >= 0 (tokens before the first capture), got {args.turn_offset}")
    tmp = None
    if args.model is None:
        if not args.quick:
            ap.error("--model is required (or --quick, which generates a tiny model)")
        from cairn.daemon.modelgen.make_model import make_model

        tmp = tempfile.TemporaryDirectory(prefix="cairn-pages-bench-")
        args.model = make_model("tiny", 0, Path(tmp.name) / "tiny")
    if not (args.model / "config.json").is_file():
        ap.error(f"--model {args.model}: no config.json there (a model directory, see `cairn make-model`)")
    try:
        res = run(args)
    finally:
        if tmp is not None:
            tmp.cleanup()
    print(tables(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
