"""The engine's dependencies, shared by the workers: kernel module, model, the one live State.

Only one request is in the engine at a time (admission), so the prefill and decode workers take
turns on `live` without a lock. With slots > 1 each slot (slots.Slot) has its own live state and
one request at a time; `live` is then unused. `kernel` is injected (the real `cairn._kernel` or a fake).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .kernel_thread import KernelRunner


@dataclass
class Engine:
    kernel: Any                       # module with AbortFlag, State, prefill, decode
    model: Any                        # kernel.Model
    tokenizer: Any                    # TextTokenizer (decode worker: text deltas, EOS)
    context_length: int
    segment: int = 4096
    chunk: int = 128
    progress_interval_s: float = 0.25  # least time between two Progress replies of a request (actors/progress.py)
    live: Any = None                  # kernel.State or None; remembers its tokens (state.tokens)
    runner: KernelRunner = field(init=False)
    checkpoints: Any = None           # actors.checkpoints.Checkpoints (None: built off in __post_init__)
    metrics: Any = None               # cairn.daemon.service.metrics.Metrics, or None (actor tests)
    slots: list = field(default_factory=list)   # slots.Slot each, when the engine has more than one
    batcher: Any = None               # slots.DecodeBatcher (slot mode)
    memory: Any = None                # memory_guard.MemoryGuard (None: no memory plan, nothing checked)
    # One-line service status for the supervisor (systemd STATUS=); a no-op unless the daemon sets it.
    announce: Callable[[str], Any] = lambda text: None

    def note_live_tokens(self) -> None:
        if self.metrics is not None:
            states = [s.live for s in self.slots] if self.slots else [self.live]
            self.metrics.live_state_tokens.set(sum(int(st.n_tokens) for st in states if st is not None))

    def __post_init__(self) -> None:
        from .expert_io import ExpertMeter

        self.runner = KernelRunner(self.kernel.AbortFlag, ExpertMeter(self.model, self.metrics))
        if self.checkpoints is None:
            from .checkpoints import Checkpoints

            self.checkpoints = Checkpoints(enabled=False)

    def new_state(self) -> Any:
        self.live = self.kernel.State(self.model)
        return self.live

    def note_slots(self) -> None:
        if self.metrics is not None and self.slots:
            for phase in ("idle", "prefill", "decode"):
                self.metrics.slots.set(sum(1 for s in self.slots if s.phase == phase), phase=phase)

    async def decode_step(self, token: int, tally: Any = None):
        """Feed one token to the live state; its next-token logits (slots.Slot batches this).
        `tally`: gets the step's expert-cache work (paged experts)."""
        return await self.runner.run(self.kernel.decode, self.live, token, tally=tally)

    def room_for(self, state, n_tokens: int, request_id: str = "") -> None:
        """THE memory hook: call before each kernel call that grows `state` by n_tokens (a prefill call,
        a decode step). Evicts checkpoints when the state needs their room; raises
        memory_guard.MemoryExceeded when the memory plan has none (the request ends with a memory error)."""
        if self.memory is not None:
            self.memory.reserve(state, n_tokens, request_id)

    def capture_refusal(self, state) -> tuple[int, str | None]:
        """The snapshot size of `state` and why it must not be taken (None: take it): the checkpoint
        store could not keep it, or the memory plan has no room for the copy."""
        nbytes = int(state.nbytes) + 4 * int(state.n_tokens) + 4 * int(self.model.vocab_size)
        why = self.checkpoints.capture_refusal(nbytes)
        if why is None and self.memory is not None:
            why = self.memory.capture_refusal(nbytes)
        return nbytes, why

    def discard_live(self) -> None:
        """After a kernel error the state may be inconsistent: never reuse it."""
        self.live = None
