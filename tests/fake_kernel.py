"""A fake of `cairn._kernel` with the same API, for tests about actor logic.

Logits are a deterministic function of the whole token history (a rolling hash seeds a generator),
so reuse, resume and chunking mistakes change answers just as with the real kernel. `chunk_delay`
makes prefill take real time per chunk (time.sleep releases the GIL); `calls` records the work done.
"""

from __future__ import annotations

import threading
import time

import numpy as np

MAX_CHUNK = 512
_MASK = (1 << 63) - 1


class AbortFlag:
    def __init__(self) -> None:
        self._e = threading.Event()

    def set(self) -> None:
        self._e.set()

    def clear(self) -> None:
        self._e.clear()

    def is_set(self) -> bool:
        return self._e.is_set()


class ExpertCache:
    """A stand-in for the kernel's routed-expert cache: each token routes to `top_k` of `experts`
    experts per layer (from its history hash); a chunk or decode step looks each needed expert up
    once; `slots` of them stay in memory (LRU); a miss "reads" `expert_bytes` in `read_s` seconds,
    of which `stall_share` stalls the compute. Counters are cumulative, as the kernel's."""

    def __init__(self, experts: int = 16, layers: int = 2, top_k: int = 2, slots: int = 8,
                 expert_bytes: int = 1 << 20, read_s: float = 0.001, stall_share: float = 0.5) -> None:
        from collections import OrderedDict

        self.experts, self.layers, self.top_k, self.slots = experts, layers, top_k, slots
        self.expert_bytes, self.read_s, self.stall_share = expert_bytes, read_s, stall_share
        self._lru: "OrderedDict[tuple[int, int], None]" = OrderedDict()
        self.stats = dict(hits=0, misses=0, bytes_read=0, read_seconds=0.0, stall_seconds=0.0, evictions=0)
        self.trace_on = False
        self.trace: list[tuple[int, int, int]] = []
        self.call_seq = 0

    def route(self, h: int) -> set[tuple[int, int]]:
        rng = np.random.default_rng(h)
        return {(layer, int(e)) for layer in range(self.layers)
                for e in rng.choice(self.experts, self.top_k, replace=False)}

    def run(self, hashes: list[int]) -> None:
        """One kernel call unit (a chunk, a decode step) over tokens with these history hashes."""
        need = set().union(*(self.route(h) for h in hashes)) if hashes else set()
        for key in sorted(need):
            if self.trace_on:
                self.trace.append((self.call_seq, key[0], key[1]))
            if key in self._lru:
                self._lru.move_to_end(key)
                self.stats["hits"] += 1
                continue
            self.stats["misses"] += 1
            self.stats["bytes_read"] += self.expert_bytes
            self.stats["read_seconds"] += self.read_s
            self.stats["stall_seconds"] += self.read_s * self.stall_share
            self._lru[key] = None
            if len(self._lru) > self.slots:
                self._lru.popitem(last=False)
                self.stats["evictions"] += 1
        self.call_seq += 1

    def info(self) -> dict:
        total = self.experts * self.layers * self.expert_bytes
        return dict(budget_bytes=self.slots * self.expert_bytes, slot_bytes=self.expert_bytes, slots=self.slots,
                    expert_bytes_total=total, dense_bytes=total // 4, experts_total=self.experts * self.layers,
                    pinned=0, direct_io=False)


class Model:
    def __init__(self, vocab_size: int = 64, fingerprint: str = "fake", chunk_delay: float = 0.0,
                 decode_delay: float = 0.0, eos_id: int | None = None, script: list[int] | None = None,
                 script_after: int = 0, expert_cache: dict | None = None) -> None:
        self.vocab_size = vocab_size
        self.fingerprint = fingerprint
        self.chunk_delay = chunk_delay
        self.decode_delay = decode_delay
        self.eos_id = eos_id
        self.script = script              # forced greedy continuation once script_after tokens are in
        self.script_after = script_after
        self.calls: list[tuple[str, int]] = []     # ("prefill_chunk", n) / ("decode", 1)
        self.snapshots = 0                         # State.snapshot calls (captures taken)
        self.chunk_started = threading.Event()
        # paged experts (the kernel's expert_cache_bytes > 0): ExpertCache(**expert_cache)
        self.experts = ExpertCache(**expert_cache) if expert_cache is not None else None

    def expert_cache_info(self) -> dict:
        if self.experts is None:
            return dict(budget_bytes=0, slot_bytes=0, slots=0, expert_bytes_total=0, dense_bytes=0,
                        experts_total=0, pinned=0, direct_io=False)
        return self.experts.info()

    def expert_cache_stats(self) -> dict:
        st = self.experts.stats if self.experts is not None else {}
        return dict(hits=0, misses=0, bytes_read=0, read_seconds=0.0, stall_seconds=0.0, evictions=0) | st

    def set_route_trace(self, on: bool) -> None:
        if self.experts is not None:
            self.experts.trace_on = bool(on)

    def take_route_trace(self) -> np.ndarray:
        rows = self.experts.trace if self.experts is not None else []
        if self.experts is not None:
            self.experts.trace = []
        return np.asarray(rows, dtype=np.int32).reshape(-1, 3)


def _experts_run(model: "Model", hashes: list[int]) -> None:
    if model.experts is not None:
        model.experts.run(hashes)


def _logits(model: Model, h: int, n: int = 0) -> np.ndarray:
    x = np.random.default_rng(h).standard_normal(model.vocab_size).astype(np.float32) * 3
    if model.eos_id is not None:
        x[model.eos_id] -= 100.0           # the fake never ends on its own
    if model.script is not None and 0 <= n - model.script_after < len(model.script):
        x[model.script[n - model.script_after]] = x.max() + 50.0
    return x


class State:
    def __init__(self, model: Model) -> None:
        self.model = model
        self._tokens: list[int] = []
        self._h = 1469598103934665603
        self.last_logits: np.ndarray | None = None

    @property
    def n_tokens(self) -> int:
        return len(self._tokens)

    @property
    def tokens(self) -> np.ndarray:
        return np.asarray(self._tokens, dtype=np.int32)

    @property
    def nbytes(self) -> int:
        return 64 * len(self._tokens)

    def _feed(self, t: int) -> None:
        self._h = ((self._h ^ (int(t) + 0x9E37)) * 1099511628211) & _MASK
        self._tokens.append(int(t))

    # No page groups: a fake snapshot is one opaque blob, which the checkpoint layer stores as a
    # tail with no pages (what it does for any bytes-like snapshot).
    page_ids = np.zeros(0, dtype=np.uint64)
    page_nbytes = 0

    @property
    def tail_nbytes(self) -> int:
        # what a capture is charged: the fake's stand-in for a whole state's size (no pages to share)
        return self.nbytes + 8 * (len(self._tokens) + 1)

    def snapshot(self, *, share_pages: bool = True) -> bytes:
        self.model.snapshots += 1
        return np.asarray([self._h] + self._tokens, dtype=np.int64).tobytes()

    @staticmethod
    def restore(model: Model, blob: bytes) -> "State":
        arr = np.frombuffer(blob, dtype=np.int64)
        s = State(model)
        s._h, s._tokens = int(arr[0]), [int(t) for t in arr[1:]]
        s.last_logits = _logits(model, s._h, len(s._tokens)) if s._tokens else None
        return s


class Snapshot:
    @staticmethod
    def from_parts(model: Model, tail, pages) -> bytes:
        if pages:
            raise ValueError("the fake kernel's snapshots have no pages")
        return bytes(tail)


def prefill(state: State, tokens, *, chunk: int = 128, abort: AbortFlag | None = None, all_logits: bool = False):
    toks = np.asarray(tokens, dtype=np.int32)
    if not 1 <= chunk <= MAX_CHUNK:
        raise ValueError("chunk out of range")
    model = state.model
    rows = []
    done = 0
    while done < len(toks):
        if abort is not None and abort.is_set():
            break
        part = toks[done: done + chunk]
        model.chunk_started.set()
        if model.chunk_delay:
            time.sleep(model.chunk_delay)
        hashes = []
        for t in part:
            state._feed(int(t))
            hashes.append(state._h)
            if all_logits:
                rows.append(_logits(model, state._h, state.n_tokens))
        _experts_run(model, hashes)
        done += len(part)
        model.calls.append(("prefill_chunk", len(part)))
        state.last_logits = _logits(model, state._h, state.n_tokens)
    if all_logits:
        return done, (np.stack(rows) if rows else np.zeros((0, model.vocab_size), np.float32))
    return done, (state.last_logits if done else np.zeros(model.vocab_size, np.float32))


def decode(state: State, token: int) -> np.ndarray:
    if state.model.decode_delay:
        time.sleep(state.model.decode_delay)
    state._feed(int(token))
    _experts_run(state.model, [state._h])
    state.model.calls.append(("decode", 1))
    state.last_logits = _logits(state.model, state._h, state.n_tokens)
    return state.last_logits


def decode_batch(states, tokens, *, abort: AbortFlag | None = None) -> np.ndarray:
    """As the kernel: one step for distinct states; each row as decode() of that state alone."""
    if len(states) != len(tokens) or not states:
        raise ValueError("states and tokens must be non-empty and of the same length")
    if len({id(s) for s in states}) != len(states):
        raise ValueError("a state appears twice")
    model = states[0].model
    if abort is not None and abort.is_set():
        return np.zeros((0, model.vocab_size), np.float32)
    if model.decode_delay:
        time.sleep(model.decode_delay)
    rows = []
    for st, t in zip(states, tokens):
        st._feed(int(t))
        st.last_logits = _logits(st.model, st._h, st.n_tokens)
        rows.append(st.last_logits)
    _experts_run(model, [st._h for st in states])
    model.calls.append(("decode_batch", len(states)))
    return np.stack(rows)


def replay_expert_policy(keys, steps, slots: int, policy: str = "lru", *, k: int = 1, n_layers: int = 0,
                         num_experts: int = 0) -> dict:
    """As the kernel's: replay keys (layer * E + expert, access order) with the MoE call of each
    (steps) through a cache of `slots` experts; the fake knows LRU only."""
    from collections import OrderedDict

    if policy != "lru":
        raise ValueError(f"policy {policy!r}: the fake knows 'lru'")
    lru: OrderedDict = OrderedDict()
    hits = misses = evictions = 0
    for k in np.asarray(keys).ravel():
        k = int(k)
        if k in lru:
            lru.move_to_end(k)
            hits += 1
        else:
            misses += 1
            lru[k] = None
            if len(lru) > slots:
                lru.popitem(last=False)
                evictions += 1
    return {"hits": hits, "misses": misses, "evictions": evictions}
