"""One OS thread that runs the kernel's calls, handed each call directly from a Trio task.

Design notes. `trio.to_thread.run_sync` costs a decode token more than it needs: its limiter yields
to the scheduler before the thread starts (so every other runnable task -- the HTTP handler writing
the last token, say -- runs first while the kernel waits), and each call goes through the thread
cache and a fresh context copy. Here a call is put on the thread's queue at once (no yield before
the kernel starts) and its result comes back with one `run_sync_soon` that reschedules the waiting
task: one wake-up each way, the least a thread hop can cost (bench/daemon_overhead.py --decode).

The same rules as `to_thread.run_sync(abandon_on_cancel=False)`: a call is never abandoned (the
thread owns the state it works on), so a cancel that arrives while it runs is delivered at the
caller's next checkpoint, after the call returned; a cancel before the call was queued raises
`Cancelled` and nothing runs. Calls run one at a time in the order queued; callers serialise them
anyway (KernelRunner's lock). The thread is started on the first call and exits after IDLE_S
without one (as trio's cached threads do), so an engine that is dropped leaves no thread behind.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

import outcome
import trio

IDLE_S = 10.0


class CallThread:
    def __init__(self, name: str = "cairn-kernel") -> None:
        self._name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()      # "is there a thread" and "it is leaving" change together
        self._thread: threading.Thread | None = None
        self.calls = 0                     # calls run (tests)

    async def run_sync(self, fn: Callable[[], Any]) -> Any:
        """`fn()` in the thread; its result or its exception. Never abandoned (see the notes)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        task = trio.lowlevel.current_task()
        token = trio.lowlevel.current_trio_token()

        def deliver(result: outcome.Outcome) -> None:      # in the thread
            try:
                token.run_sync_soon(trio.lowlevel.reschedule, task, outcome.Value(result))
            except trio.RunFinishedError:                    # the run is over: nobody waits for it
                pass

        self._put((fn, deliver))
        result = await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)
        return result.unwrap()

    def _put(self, job) -> None:
        with self._lock:
            self._jobs.put(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        while True:
            try:
                fn, deliver = self._jobs.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty():
                        self._thread = None
                        return
                continue
            self.calls += 1
            deliver(outcome.capture(fn))
            del fn, deliver
