"""Sequence slots (slots > 1): N live states sharing one engine, and the batched decode step.

Design notes.
 * `Slot` is one live state's view of the `Engine`: the prefill and decode code (prefill.py,
   decode.py, lifecycle.py) take it where they take the engine, and it answers with its own `live`
   state, its own `discard_live`, its own kernel runner and its own decode step; everything else
   (kernel, model, checkpoints shared by all slots, metrics, settings) is the engine's.
 * Every kernel call of a slot passes the shared `KernelGate` (kernel_gate.py: decode steps first,
   then the prefill with the fewest tokens left) and is one prefill chunk or one decode step long
   (`segment` = `chunk` in slot mode), so a long prefill delays the other streams by one chunk.
 * `DecodeBatcher` runs one `decode_batch` kernel call for every sequence that waits for its next
   token: the kernel reads each weight once for all of them, and each sequence's logits and state
   are bit-identical to a decode of it alone (tests/native/test_decode_batch.py). It waits for
   every decoding sequence to hand in its token, but no longer than `gather_s` after the first —
   so a client that is slow to read (its reply buffer full) does not hold up the others.
 * Cancel is per sequence: a token not yet taken into a step is withdrawn at once; one in the
   running step waits (shielded) for that step to finish, so when the request's cancel is
   acknowledged the kernel no longer touches its state — the other states in the step are not
   affected at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import trio

from .expert_io import ExpertTally
from .kernel_gate import DECODE, KernelGate, prefill_priority
from .slot_policy import SlotView


class SlotRunner:
    """The engine's kernel runner behind the gate, at the slot's priority."""

    def __init__(self, slot: "Slot", inner, gate: KernelGate) -> None:
        self._slot, self._inner, self._gate = slot, inner, gate

    async def run(self, fn, *args, abortable: bool = False, priority=None, **kwargs) -> Any:
        async with self._gate.hold(priority if priority is not None else self._slot.priority()):
            return await self._inner.run(fn, *args, abortable=abortable, **kwargs)


class Slot:
    def __init__(self, engine, index: int, gate: KernelGate, batcher: "DecodeBatcher") -> None:
        self._engine = engine
        self.index = index
        self.live: Any = None
        self.runner = SlotRunner(self, engine.runner, gate)
        self._batcher = batcher
        self.request_id: str | None = None     # the request it serves (None: idle)
        self.prompt_tokens = 0
        self.phase = "idle"                    # idle | prefill | decode
        self.last_used = 0.0

    def __getattr__(self, name: str) -> Any:   # shared engine attributes (kernel, model, checkpoints, ...)
        return getattr(self._engine, name)

    @property
    def segment(self) -> int:                  # one chunk per kernel call: others wait at most one chunk
        return self._engine.chunk

    def priority(self) -> tuple[int, int]:
        done = 0 if self.live is None else int(self.live.n_tokens)
        return prefill_priority(self.prompt_tokens - done)

    def new_state(self) -> Any:
        self.live = self._engine.kernel.State(self._engine.model)
        return self.live

    def discard_live(self) -> None:
        self.live = None

    def note_live_tokens(self) -> None:
        self._engine.note_live_tokens()

    async def decode_step(self, token: int, tally: Any = None):
        return await self._batcher.step(self.live, token, tally)

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        self._engine.note_slots()

    def view(self) -> SlotView:
        live = self.live
        tokens = None
        busy = self.request_id is not None
        # A busy slot's state may be in the kernel thread right now: its tokens are not read (nor needed).
        if not busy and live is not None and live.last_logits is not None:
            tokens = np.asarray(live.tokens, dtype=np.int32)
        return SlotView(self.index, busy, tokens, self.last_used)

    def take(self, request_id: str, prompt_tokens: int) -> None:
        self.request_id, self.prompt_tokens = request_id, prompt_tokens
        self.set_phase("prefill")

    def release(self) -> None:
        self.request_id = None
        self.last_used = trio.current_time()
        self.set_phase("idle")

    def describe(self) -> dict:
        """What the slot holds and does (/v1/status, metrics)."""
        live = self.live
        return {"slot": self.index, "request_id": self.request_id, "phase": self.phase,
                "state_tokens": 0 if live is None else int(live.n_tokens)}


@dataclass(eq=False)
class _Step:
    state: Any
    token: int
    done: trio.Event = field(default_factory=trio.Event)
    logits: Any = None
    error: BaseException | None = None
    tally: Any = None          # expert_io.ExpertTally of the request (None: not counted)


class DecodeBatcher:
    def __init__(self, engine, gate: KernelGate, *, gather_s: float = 0.005) -> None:
        self._engine, self._gate, self.gather_s = engine, gate, gather_s
        self._pending: list[_Step] = []
        self._arrived = trio.Event()
        self.decoding: Callable[[], int] = lambda: 0   # sequences in their decode phase (the scheduler's)
        self.steps = 0                          # batched kernel calls made (metrics, tests)
        self.rows = 0                           # sequence-steps they advanced

    async def step(self, state, token: int, tally: Any = None):
        """Feed `token` to `state` in the next batched step; its logits [V]. `tally` gets the whole
        step's expert-cache work: the experts a step reads serve every sequence in it (shared)."""
        entry = _Step(state, int(token), tally=tally)
        self._pending.append(entry)
        self._arrived.set()
        try:
            await entry.done.wait()
        except trio.Cancelled:
            if entry in self._pending:          # not started: withdraw it, nothing ran
                self._pending.remove(entry)
                raise
            with trio.CancelScope(shield=True):  # in the running step: wait until the kernel lets go
                await entry.done.wait()
            raise
        if entry.error is not None:
            raise entry.error
        return entry.logits

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            while not self._pending:
                self._arrived = trio.Event()
                await self._arrived.wait()
            with trio.move_on_after(self.gather_s):
                while len(self._pending) < self.decoding():
                    self._arrived = trio.Event()
                    await self._arrived.wait()
            batch, self._pending = self._pending, []
            if not batch:
                continue
            try:
                kernel = self._engine.kernel
                step_io = ExpertTally()
                async with self._gate.hold(DECODE):
                    out = await self._engine.runner.run(kernel.decode_batch, [e.state for e in batch],
                                                        [e.token for e in batch], tally=step_io)
                for e in batch:
                    if e.tally is not None:
                        e.tally.add(step_io.io)
                self.steps += 1
                self.rows += len(batch)
                metrics = self._engine.metrics
                if metrics is not None:
                    metrics.decode_steps.inc()
                    metrics.decode_step_rows.inc(len(batch))
                for i, e in enumerate(batch):
                    e.logits = out[i]
            except Exception as exc:            # every sequence of the step fails (its state may be torn)
                for e in batch:
                    e.error = exc
            finally:
                for e in batch:
                    if e.logits is None and e.error is None:
                        e.error = RuntimeError("the engine stopped before this decode step finished")
                    e.done.set()
