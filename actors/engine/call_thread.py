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

Decode steps without the GIL (`worker`, the kernel's `StepWorker`, native/src/step_worker.h). Even
this hop cost a token about 0.14 ms each way on the tiny model; the thread needs the GIL to leave
its queue and enter the kernel, and again to publish the result, while the Trio thread holds it for
the HTTP handler's work (measured: the way back gets faster without it; the way in is mostly the
thread's wake-up). With a worker the thread waits inside `worker.serve` with the GIL released; `run_step`
posts a decode step there (inputs copied, output allocated on the Trio thread), the step runs
without ever taking the GIL and signals an eventfd the task awaits with `wait_readable`, and the
result is collected on the Trio thread. Python calls still come through the queue: `post_python`
makes `serve` return to run them. The same rules hold: a step is never abandoned (the wait is
shielded; a cancel is delivered at the caller's next checkpoint), nothing runs if the cancel came
first, one call at a time on one thread (so OpenMP keeps one pool of workers).

At interpreter exit every thread is stopped and joined (an `atexit` hook): an idle thread waits inside
`worker.serve` with the GIL released, and if that wait ended while Python finalizes, taking the GIL back
would end the thread by a forced unwind through the kernel's C++ frames: `std::terminate` and exit
status 134 after everything had passed (seen at the end of pytest runs). Atexit hooks run before
finalization, while a thread can still take the GIL and leave normally.
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from typing import Any, Callable

import outcome
import trio

IDLE_S = 10.0
STOP_JOIN_S = 5.0   # at exit: how long to wait for a thread still in a kernel call

_LIVE: "weakref.WeakSet[CallThread]" = weakref.WeakSet()


class CallThread:
    def __init__(self, name: str = "cairn-kernel", worker: Any = None) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()      # "is there a thread" and "it is leaving" change together
        self._thread: threading.Thread | None = None
        self.worker = worker               # the kernel's StepWorker, or None (every call through the queue)
        self.calls = 0                     # calls run (tests)
        self.steps = 0                     # decode steps run through the worker (tests)
        self._stopping = False             # set by stop(): the thread leaves at its next idle moment
        _LIVE.add(self)

    async def run_step(self, state: Any, token: int) -> tuple:
        """`decode(state, token)` in the thread, without the GIL (needs `worker`): (logits [V], start ns,
        end ns, CPU ns) of the kernel's own run (perf_counter_ns; the thread's CPU). Never abandoned."""
        await trio.lowlevel.checkpoint_if_cancelled()
        worker = self.worker
        with self._lock:
            worker.decode(state, token)    # validates, claims the state, posts; raises before posting
            self._ensure_thread()
        with trio.CancelScope(shield=True):        # the step runs to its end; a cancel is delivered after
            await trio.lowlevel.wait_readable(worker.fileno())
        self.steps += 1
        return worker.collect()

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
            if self.worker is not None:
                self.worker.post_python()
            self._ensure_thread()

    def stop(self, timeout: float = STOP_JOIN_S) -> None:
        """Make the thread leave now rather than after IDLE_S (a call running still finishes) and
        wait up to `timeout` for it. A later call starts a new thread."""
        with self._lock:
            thread = self._thread
            if thread is None:
                return
            self._stopping = True
            if self.worker is not None:
                self.worker.post_python()  # `serve` returns; no job is queued for it
            else:
                self._jobs.put(None)
        thread.join(timeout)

    def _ensure_thread(self) -> None:
        if self._thread is None:           # with self._lock held
            self._stopping = False
            self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
            self._thread.start()

    def _next(self):
        """The next Python job; None after IDLE_S without any work."""
        if self.worker is None:
            try:
                return self._jobs.get(timeout=IDLE_S)
            except queue.Empty:
                return None
        # runs the steps posted meanwhile without the GIL; True: a Python job was posted (it is queued,
        # unless stop() woke it)
        if not self.worker.serve(IDLE_S):
            return None
        try:
            return self._jobs.get_nowait()
        except queue.Empty:
            return None

    def _loop(self) -> None:
        while True:
            job = self._next()
            if job is None:
                with self._lock:           # posting takes the lock too: nothing is posted to a leaving thread
                    if self._stopping or (self._jobs.empty() and (self.worker is None or self.worker.idle)):
                        self._thread = None
                        return
                continue
            fn, deliver = job
            self.calls += 1
            deliver(outcome.capture(fn))
            del fn, deliver, job


@atexit.register
def _stop_all() -> None:
    for t in list(_LIVE):
        t.stop()
