"""A fake of `cairn._kernel` with the same API, for tests about actor logic.

Logits are a deterministic function of the whole token history (a rolling hash seeds a generator),
so reuse, resume and chunking mistakes change answers just as with the real kernel. Like a real
model on agent work the fake often repeats its context: at three positions in four (by the hash)
the token that followed the latest earlier occurrence of the last token leads, so prompt-lookup
drafts are sent, and partly accepted, in every test that decodes (`copy=False` turns it off). `chunk_delay`
makes prefill take real time per chunk (time.sleep releases the GIL); `calls` records the work done.
`verify` / `rewind` have the kernel's semantics (native/cairn/_kernel.pyi, tests/native/test_speculate.py):
verify feeds a token and its draft in one call and gives every row's logits, keeping an undo journal
until the state's next call; rewind takes back any of the tokens that call fed.
"""

from __future__ import annotations

import threading
import time

import numpy as np

MAX_CHUNK = 512
_MASK = (1 << 63) - 1


class KernelError(ValueError):
    """Bad input to the kernel, as the real kernel's."""


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
                 script_after: int = 0, expert_cache: dict | None = None, rule=None, copy: bool = True) -> None:
        self.vocab_size = vocab_size
        self.fingerprint = fingerprint
        self.chunk_delay = chunk_delay
        self.decode_delay = decode_delay
        self.eos_id = eos_id
        self.script = script              # forced greedy continuation once script_after tokens are in
        self.script_after = script_after
        self.rule = rule                  # history (list of ids) -> the forced greedy next token, or None
        self.copy = copy                  # often repeat the context (see the module's docstring)
        self.calls: list[tuple[str, int]] = []     # ("prefill_chunk", n) / ("decode", 1) / ("verify", S) ...
        self.rewinds: list[int] = []               # k of every rewind call
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


def _logits(model: Model, h: int, n: int = 0, history: list[int] | None = None,
            copy: int | None = None) -> np.ndarray:
    x = np.random.default_rng(h).standard_normal(model.vocab_size).astype(np.float32) * 3
    if model.eos_id is not None:
        x[model.eos_id] -= 100.0           # the fake never ends on its own
    if model.copy and copy is not None and copy != model.eos_id and h % 4:
        x[copy] = x.max() + 6.0            # repeat the context (sampling may still leave it)
    if model.script is not None and 0 <= n - model.script_after < len(model.script):
        x[model.script[n - model.script_after]] = x.max() + 50.0
    if model.rule is not None and history is not None:
        forced = model.rule(history)
        if forced is not None:
            x[int(forced)] = x.max() + 50.0
    return x


def _state_logits(st: "State") -> np.ndarray:
    copy = st._follow.get(st._tokens[-1]) if st._tokens else None
    return _logits(st.model, st._h, st.n_tokens, st._tokens, copy)


class State:
    def __init__(self, model: Model) -> None:
        self.model = model
        self._tokens: list[int] = []
        self._h = 1469598103934665603
        self.last_logits: np.ndarray | None = None
        self._follow: dict[int, int] = {}   # token -> the token after its latest occurrence
        # the undo journal of the last call when it was a verify: (hash, last logits, follow entry)
        # before each token it fed that is still kept; None after any other call
        self._journal: list[tuple] | None = None

    @property
    def rewindable(self) -> int:
        return len(self._journal) if self._journal is not None else 0

    @property
    def n_tokens(self) -> int:
        return len(self._tokens)

    @property
    def tokens(self) -> np.ndarray:
        return np.asarray(self._tokens, dtype=np.int32)

    @property
    def nbytes(self) -> int:
        return 64 * len(self._tokens)

    def _feed(self, t: int, journal: bool = False) -> None:
        prev = self._tokens[-1] if self._tokens else None
        if journal:
            self._journal.append((self._h, self.last_logits, prev, self._follow.get(prev)))
        else:
            self._journal = None           # a plain call: nothing to rewind into any more
        if prev is not None:
            self._follow[prev] = int(t)
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
        s._follow = dict(zip(s._tokens, s._tokens[1:]))
        s.last_logits = _state_logits(s) if s._tokens else None
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
                rows.append(_state_logits(state))
        _experts_run(model, hashes)
        done += len(part)
        model.calls.append(("prefill_chunk", len(part)))
        state.last_logits = _state_logits(state)
    if all_logits:
        return done, (np.stack(rows) if rows else np.zeros((0, model.vocab_size), np.float32))
    return done, (state.last_logits if done else np.zeros(model.vocab_size, np.float32))


def decode(state: State, token: int) -> np.ndarray:
    if state.model.decode_delay:
        time.sleep(state.model.decode_delay)
    state._feed(int(token))
    _experts_run(state.model, [state._h])
    state.model.calls.append(("decode", 1))
    state.last_logits = _state_logits(state)
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
        st.last_logits = _state_logits(st)
        rows.append(st.last_logits)
    _experts_run(model, [st._h for st in states])
    model.calls.append(("decode_batch", len(states)))
    return np.stack(rows)


def _draft_tokens(model: Model, tokens, what: str) -> np.ndarray:
    toks = np.asarray(tokens)
    if toks.ndim != 1 or toks.shape[0] == 0:
        raise KernelError(f"{what}: tokens is empty")
    if toks.shape[0] > MAX_CHUNK:
        raise KernelError(f"{what} has {toks.shape[0]} tokens; one verify takes 1..{MAX_CHUNK}")
    bad = np.flatnonzero((toks < 0) | (toks >= model.vocab_size))
    if bad.size:
        i = int(bad[0])
        raise KernelError(f"{what}: token id {int(toks[i])} at index {i} is out of range")
    return toks.astype(np.int32)


def _verify_one(st: State, toks: np.ndarray) -> np.ndarray:
    """[S, V]: the logits after each fed token, each as decode() of it alone; journaled."""
    st._journal = []
    rows = []
    for t in toks:
        st._feed(int(t), journal=True)
        st.last_logits = _state_logits(st)
        rows.append(st.last_logits)
    return np.stack(rows)


def verify(state: State, tokens) -> np.ndarray:
    """As the kernel: feed tokens (a decoded token and its draft) in one call; [S, V] logits, and
    until the state's next call rewind() can take back any of them."""
    model = state.model
    toks = _draft_tokens(model, tokens, "tokens")
    if model.decode_delay:
        time.sleep(model.decode_delay)
    out = _verify_one(state, toks)
    _experts_run(model, [state._h])
    model.calls.append(("verify", len(toks)))
    return out


def verify_batch(states, tokens) -> list[np.ndarray]:
    """verify() of each state in one call; one [S_i, V] array each."""
    if not states:
        raise KernelError("verify_batch: states is empty")
    if len(states) != len(tokens):
        raise KernelError(f"verify_batch: {len(states)} states and {len(tokens)} token arrays must match")
    seen = set()
    for i, st in enumerate(states):
        if id(st) in seen:
            raise KernelError(f"verify_batch: states[{i}] appears twice")
        seen.add(id(st))
    model = states[0].model
    feeds = [_draft_tokens(model, t, f"tokens[{i}]") for i, t in enumerate(tokens)]
    if sum(len(f) for f in feeds) > MAX_CHUNK:
        raise KernelError(f"verify_batch feeds {sum(len(f) for f in feeds)} tokens in all; one call takes up to "
                          f"{MAX_CHUNK}")
    if model.decode_delay:
        time.sleep(model.decode_delay)
    out = [_verify_one(st, f) for st, f in zip(states, feeds)]
    _experts_run(model, [st._h for st in states])
    model.calls.append(("verify_batch", len(states)))
    return out


def rewind(state: State, k: int) -> None:
    """As the kernel: take back the last k tokens the state's last call (a verify) fed and still keeps."""
    j = state._journal
    if j is None:
        raise KernelError("rewind: the state's last call was not a speculative one (verify)")
    if not 0 <= int(k) <= len(j):
        raise KernelError(f"rewind: k must be in 0..{len(j)} (the tokens the last verify fed that are still kept), "
                          f"got {int(k)}")
    for _ in range(int(k)):
        state._h, state.last_logits, prev, follow = j.pop()
        state._tokens.pop()
        if prev is not None:
            if follow is None:
                del state._follow[prev]
            else:
                state._follow[prev] = follow
    state.model.rewinds.append(int(k))


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
