"""A kernel wrapper whose pace the test sets: every prefill chunk and every decode step waits for a
permit, so a test can hold the kernel mid-prompt or mid-answer, act (disconnect, queue, signal), and
then count exactly how much work the kernel did afterwards -- no sleeps, no elapsed-time bounds.

Wraps any module with the kernel API (the real `cairn._kernel` or tests/fake_kernel.py). Prefill
runs the wrapped kernel one chunk per call (the real kernel gives the same bits for any split into
calls) and checks the abort flag between chunks, as the kernel does; a chunk waiting for a permit
also returns as soon as the flag is set, which is the kernel's own behaviour at a chunk boundary.
"""

from __future__ import annotations

import threading

import numpy as np
import trio


class Gate:
    def __init__(self, permits: int | None = None, max_wait: float = 15.0) -> None:
        self._cond = threading.Condition()
        self._max_wait = max_wait        # a test that fails while holding the gate must not hang
        self._permits = permits          # None: unlimited
        self.calls: list[tuple[str, int]] = []   # ("prefill_chunk", n) / ("decode", 1), in order
        self.waiting = False             # the kernel thread is blocked on the gate right now

    # --- test side ---------------------------------------------------------------------------------
    def allow(self, n: int | None) -> None:
        """Let n more kernel steps run (None: all from now on)."""
        with self._cond:
            if n is None:
                self._permits = None
            elif self._permits is not None:
                self._permits += n
            self._cond.notify_all()

    def hold(self) -> None:
        with self._cond:
            self._permits = 0

    def count(self, kind: str) -> int:
        with self._cond:
            return sum(1 for k, _ in self.calls if k == kind)

    async def wait_blocked(self, timeout: float = 30) -> None:
        """Until the kernel thread waits for a permit (it has used up the ones it was given)."""
        with trio.fail_after(timeout):
            while not self.waiting:
                await trio.sleep(0.001)

    # --- kernel-thread side ------------------------------------------------------------------------
    def _enter(self, abort=None) -> bool:
        """Take a permit; False if the abort flag was set first."""
        def ready() -> bool:
            return self._permits != 0 or (abort is not None and abort.is_set())

        with self._cond:
            if not ready():
                self.waiting = True
                ok = self._cond.wait_for(ready, timeout=self._max_wait)
                self.waiting = False
                if not ok:
                    raise RuntimeError(f"gated kernel: held for {self._max_wait} s and never released")
            if abort is not None and abort.is_set():
                return False
            if self._permits is not None:
                self._permits -= 1
            return True

    def _record(self, kind: str, n: int) -> None:
        with self._cond:
            self.calls.append((kind, n))


class GatedKernel:
    """Module-like: AbortFlag, State, prefill, decode, decode_batch, verify and verify_batch gated by
    `gate`; everything else delegated (rewind too: it only takes back what a gated call fed)."""

    def __init__(self, kernel, gate: Gate, vocab_size: int) -> None:
        self._k = kernel
        self._vocab = vocab_size
        self.gate = gate
        outer = self

        class AbortFlag:
            def __init__(self) -> None:
                self._set = False

            def set(self) -> None:
                with outer.gate._cond:
                    self._set = True
                    outer.gate._cond.notify_all()   # wake a chunk waiting for a permit

            def clear(self) -> None:
                self._set = False

            def is_set(self) -> bool:
                return self._set

        self.AbortFlag = AbortFlag

    # No GIL-free step hand-off (the engine then steps through `decode` below): a step posted to the
    # kernel's StepWorker would run the wrapped kernel directly, past the gate
    StepWorker = None

    def __getattr__(self, name):
        return getattr(self._k, name)

    def prefill(self, state, tokens, *, chunk: int = 128, abort=None, all_logits: bool = False):
        toks = np.asarray(tokens, dtype=np.int32)
        done, rows, last = 0, [], None
        while done < len(toks):
            if not self.gate._enter(abort):
                break
            n, out = self._k.prefill(state, toks[done:done + chunk], chunk=chunk, all_logits=all_logits)
            self.gate._record("prefill_chunk", n)
            done += n
            if all_logits:
                rows.append(out)
            last = out
        if all_logits:
            return done, (np.concatenate(rows) if rows else np.zeros((0, self._vocab), np.float32))
        return done, (last if done else np.zeros(0, np.float32))

    def decode(self, state, token: int):
        self.gate._enter()
        out = self._k.decode(state, token)
        self.gate._record("decode", 1)
        return out

    def decode_batch(self, states, tokens, *, abort=None):
        self.gate._enter()
        out = self._k.decode_batch(states, tokens, abort=abort)
        self.gate._record("decode_batch", len(states))
        return out

    def verify(self, state, tokens):
        self.gate._enter()
        out = self._k.verify(state, tokens)
        self.gate._record("verify", len(tokens))
        return out

    def verify_batch(self, states, tokens):
        self.gate._enter()
        out = self._k.verify_batch(states, tokens)
        self.gate._record("verify_batch", len(states))
        return out


def gated(loaded, gate: Gate):
    """A copy of a daemon's `Loaded` whose kernel goes through `gate`."""
    import dataclasses

    return dataclasses.replace(loaded, kernel=GatedKernel(loaded.kernel, gate, int(loaded.model.vocab_size)))
