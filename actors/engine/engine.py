"""The engine's shared things, held explicitly: kernel module, model, checkpoints, metrics, the kernel
gate and runner, and the N sequence slots (`slots`, one `Sequence` each; N = 1 is the same engine).

The prefill and decode workers take a `Sequence` and this engine: a sequence's own state lives in
its dataclass (sequence.py), everything shared lives here. Every kernel call goes through `run`:
the `KernelGate` (decode step first, then the prefill with the fewest tokens left) and then the
one kernel thread. `kernel` is injected (the real `cairn._kernel` or a fake).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import trio

from .kernel_gate import KernelGate
from .kernel_thread import KernelRunner
from .sequence import Sequence
from .slot_policy import choose_slot


@dataclass
class Engine:
    kernel: Any                       # module with AbortFlag, State, prefill, decode, decode_batch
    model: Any                        # kernel.Model
    tokenizer: Any                    # TextTokenizer (decode worker: text deltas, EOS)
    context_length: int
    segment: int = 4096
    chunk: int = 128
    progress_interval_s: float = 0.25  # least time between two Progress replies of a request (actors/engine/progress.py)
    runner: KernelRunner = field(init=False)
    checkpoints: Any = None           # actors.checkpoints.actor.Checkpoints (None: built off in __post_init__)
    metrics: Any = None               # cairn.daemon.service.metrics.Metrics, or None (actor tests)
    slots: list = field(default_factory=lambda: [Sequence(0)])   # the sequences (wiring.start_engine sets N)
    gate: KernelGate = field(default_factory=KernelGate)
    memory: Any = None                # memory_guard.MemoryGuard (None: no memory plan, nothing checked)
    speculate: bool = False           # verify prompt-lookup drafts in decode (actors/decoding/speculation.py)
    # One-line service status for the supervisor (systemd STATUS=); a no-op unless the daemon sets it.
    announce: Callable[[str], Any] = lambda text: None

    def __post_init__(self) -> None:
        from .expert_io import ExpertMeter

        worker = getattr(self.kernel, "StepWorker", None)     # decode steps without the GIL (call_thread.py)
        self.runner = KernelRunner(self.kernel.AbortFlag, ExpertMeter(self.model, self.metrics),
                                   step_worker=worker() if worker is not None else None)
        self.runner.publish = self.publish_figures
        if self.checkpoints is None:
            from ..checkpoints.actor import Checkpoints

            self.checkpoints = Checkpoints(enabled=False)

    # --- kernel calls ------------------------------------------------------------------------------

    async def run(self, priority: tuple[int, int], fn, *args: Any, **kwargs: Any) -> Any:
        """`fn(*args)` in the kernel thread once the gate grants `priority` (kernel_gate.py)."""
        async with self.gate.hold(priority):
            return await self.runner.run(fn, *args, **kwargs)

    def publish_figures(self, args: tuple) -> None:
        """In the kernel thread after each call (KernelRunner.publish): the figures of the slots whose
        state the call was given (an argument, or in a list of them: a batched step). Only those: an
        idle slot's state may be read on the Trio thread meanwhile, and two reads of one state at once
        are refused like a read during a call."""
        given = set()
        for a in args:
            for x in (a if isinstance(a, (list, tuple)) else (a,)):
                given.add(id(x))
        for seq in self.slots:
            if seq.state is not None and id(seq.state) in given:
                seq.publish()

    @property
    def piece_tokens(self) -> int:
        """Prompt tokens per prefill kernel call: a segment when the engine holds one sequence (it has
        nobody to wait for it), one chunk otherwise, so another stream waits at most one chunk."""
        return self.segment if len(self.slots) == 1 else self.chunk

    def room_for(self, seq: Sequence, n_tokens: int) -> None:
        """The memory hook, called before every kernel call that grows `seq`'s state by `n_tokens` (a
        prefill piece, a decode step): evicts checkpoints when the state needs their room; raises
        memory_guard.MemoryExceeded when the memory plan has none (the request ends with a memory error)."""
        if self.memory is not None and seq.state is not None:
            self.memory.reserve(seq.state, n_tokens, seq.request_id or "")

    def try_room_for(self, seq: Sequence, n_tokens: int) -> bool:
        """`room_for` for growth the caller can do without (a draft to verify): room is made the same
        way, but no room answers False instead of ending the request."""
        if self.memory is None or seq.state is None:
            return True
        return self.memory.try_reserve(seq.state, n_tokens, seq.request_id or "")

    def restore_bytes(self, entry) -> int:
        """What bringing checkpoint `entry` (store.Entry) into a live state holds beside everything the
        guard counts, until the new state is the slot's: the live state's full-size buffers and tail (its
        page groups are the snapshot's), and for a disk-only entry the file's bytes read and the snapshot
        rebuilt from them (twice its size). 0 without a memory plan."""
        cost = None if self.memory is None else self.memory.plan.state_cost
        if cost is None:
            return 0
        pages = len(entry.mem.pages) * entry.mem.page_nbytes if entry.mem is not None else 0
        live = max(0, cost.resident_at(entry.n_tokens) - pages)
        return live + (0 if entry.in_memory else 2 * int(entry.nbytes))

    def hold_room(self, nbytes: int, request_id: str = "", spare: tuple[str, ...] = ()):
        """A `with` block holding `nbytes` in the memory plan (memory_guard.MemoryGuard.hold; `spare`:
        checkpoint ids not evicted for it); it yields False when there is no room even after evicting,
        True (holding nothing) without a plan."""
        if self.memory is None or nbytes <= 0:
            return nullcontext(True)
        return self.memory.hold(nbytes, request_id, spare)

    def capture_refusal(self, seq: Sequence, kind: str = "prompt_end") -> tuple[int, str | None]:
        """What a snapshot of `seq`'s state would add to checkpoint memory (its tail and the page groups
        the store does not hold yet) and why it must not be taken (None: take it): the checkpoint
        store could not keep it, or the memory plan has no room for the copy. From its figures."""
        fig = seq.figures
        nbytes = self.checkpoints.capture_bytes(fig)
        why = self.checkpoints.capture_refusal(nbytes, fig, kind)
        if why is None and self.memory is not None:   # the copy itself: the tail (every group when unshared)
            copied = fig.tail_nbytes + (0 if self.checkpoints.share_pages else len(fig.page_ids) * fig.page_nbytes)
            why = self.memory.capture_refusal(copied)
        return nbytes, why

    # --- the sequences -----------------------------------------------------------------------------

    def assign(self, request_id: str, prompt) -> tuple[Sequence, int]:
        """The idle slot for a new request (slot_policy.py), now taken; and the live tokens it shares."""
        choice = choose_slot([s.view() for s in self.slots], np.asarray(prompt, dtype=np.int32))
        if choice is None:   # pragma: no cover - admission admits at most len(slots)
            raise RuntimeError("engine: a request was admitted with every slot busy")
        seq = self.slots[choice.index]
        seq.request_id, seq.prompt_tokens = request_id, len(prompt)
        self.set_phase(seq, "prefill")
        return seq, choice.shared

    def release(self, seq: Sequence) -> None:
        """The request has ended and the kernel no longer touches its state: the slot is idle again
        (before `Finished` goes to admission, so the next admitted request finds it free)."""
        seq.request_id = None
        seq.last_used = trio.current_time()
        self.set_phase(seq, "idle")

    def set_phase(self, seq: Sequence, phase: str) -> None:
        seq.phase = phase
        self.note_slots()

    def new_state(self, seq: Sequence) -> Any:
        seq.state = self.kernel.State(self.model)
        return seq.state

    def discard(self, seq: Sequence) -> None:
        """After a kernel error the state may be inconsistent: never reuse it."""
        seq.state = None

    def decoding(self) -> int:
        return sum(1 for s in self.slots if s.phase == "decode")

    def note_live_tokens(self) -> None:
        if self.metrics is not None:
            self.metrics.live_state_tokens.set(sum(s.figures.n_tokens for s in self.slots))

    def note_slots(self) -> None:
        if self.metrics is not None:
            for phase in ("idle", "prefill", "decode"):
                self.metrics.slots.set(sum(1 for s in self.slots if s.phase == phase), phase=phase)
