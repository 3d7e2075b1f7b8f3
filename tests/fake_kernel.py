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


class Model:
    def __init__(self, vocab_size: int = 64, fingerprint: str = "fake", chunk_delay: float = 0.0,
                 decode_delay: float = 0.0, eos_id: int | None = None, script: list[int] | None = None,
                 script_after: int = 0) -> None:
        self.vocab_size = vocab_size
        self.fingerprint = fingerprint
        self.chunk_delay = chunk_delay
        self.decode_delay = decode_delay
        self.eos_id = eos_id
        self.script = script              # forced greedy continuation once script_after tokens are in
        self.script_after = script_after
        self.calls: list[tuple[str, int]] = []     # ("prefill_chunk", n) / ("decode", 1)
        self.chunk_started = threading.Event()


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

    def snapshot(self) -> bytes:
        return np.asarray([self._h] + self._tokens, dtype=np.int64).tobytes()

    @staticmethod
    def restore(model: Model, blob: bytes) -> "State":
        arr = np.frombuffer(blob, dtype=np.int64)
        s = State(model)
        s._h, s._tokens = int(arr[0]), [int(t) for t in arr[1:]]
        s.last_logits = _logits(model, s._h, len(s._tokens)) if s._tokens else None
        return s


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
        for t in part:
            state._feed(int(t))
            if all_logits:
                rows.append(_logits(model, state._h, state.n_tokens))
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
    model.calls.append(("decode_batch", len(states)))
    return np.stack(rows)
