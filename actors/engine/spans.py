"""Where a decode token's time goes in the daemon: named spans summed per request, off unless asked.

Design notes. bench/daemon_overhead.py --decode starts the daemon with CAIRN_DECODE_SPANS=1; then
every request's `RequestTrace.spans` is a `Spans` and the decode path (actors/engine/decode.py) and the HTTP
edge (daemon/api/app.py) add perf_counter_ns spans to it; the request's log line carries them as
`spans_us` (total microseconds per span over the request; the bench divides by its tokens). Off (the
default) `spans` is None and each site costs one `is not None` test. All on the Trio thread, except
what the kernel thread measures itself (KernelRunner's `spent`). The names:

  pick      choosing the token (shaping, argmax or sampling; a worker thread for large vocabularies)
  text      detokenizing and the stop-string check
  submit    handing the token in for the next step (the memory plan's check, drafting)
  reply     putting TokenOut into the request's reply channel
  to_step   from handing the token in to the step's kernel call starting (the stepping task waking,
            the kernel gate)
  hop_in    from asking for the step's kernel call to its start in the kernel thread
  hop_out   from its end there to the Trio task resuming (the wake-up; the publish: in the thread, or
            for a GIL-free step (call_thread.py) on the Trio thread once it is collected)
  after     the step's bookkeeping once the call returned (timing, tallies, metrics)
  wake      from the step's end to the request's task running again
  http      the HTTP handler's work per message: status, the responder (parse, JSON), the ASGI send
"""

from __future__ import annotations

import os
import time

ENV = "CAIRN_DECODE_SPANS"


def enabled() -> bool:
    return os.environ.get(ENV) == "1"


now_ns = time.perf_counter_ns


class Spans:
    __slots__ = ("ns", "last")

    def __init__(self) -> None:
        self.ns: dict[str, int] = {}
        self.last = 0                    # perf_counter_ns of the last lap

    def add(self, name: str, ns: int) -> None:
        self.ns[name] = self.ns.get(name, 0) + ns

    def lap(self, name: str | None = None) -> None:
        """The time since the last lap goes to `name` (None: only start a lap)."""
        t = now_ns()
        if name is not None:
            self.add(name, t - self.last)
        self.last = t

    def us(self) -> dict[str, float]:
        """Total microseconds per span (the log line's `spans_us`)."""
        return {k: round(v / 1000, 1) for k, v in self.ns.items()}
