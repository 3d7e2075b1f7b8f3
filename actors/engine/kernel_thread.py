"""Run one kernel call in a worker thread, mapping the caller's cancel scope onto an AbortFlag.

Design notes. The thread owns the model state, so it is never abandoned: the one kernel thread
(call_thread.py: a call goes to it without a yield to the scheduler first, one wake-up each way)
never gives up on a call, and one `CapacityLimiter(1)` serialises every kernel call. A watcher task sleeps beside the call; when the surrounding scope is cancelled its `finally`
sets the abort flag, the kernel returns at its next chunk boundary, the thread call completes and
only then does `Cancelled` propagate. So when this function raises `Cancelled`, the kernel has
stopped and the state is consistent (it holds every completed chunk). The watcher's nursery never
lets a group out: callers see the kernel's own exception (`ValueError`, `RuntimeError`, ...) or
`Cancelled`, which is what lifecycle.py's `except` clauses match.

After every call, still in the kernel thread, `publish(args)` (when set; the engine's) runs: the
call's states are still its own (no other call runs, and their requests wait for this one), so the
engine publishes their figures for the readers that must not touch a state a call may hold
(actors/engine/sequence.py).

`clocked(fn, spent)` is `fn` that appends (start, end, CPU) of its run in the kernel thread to `spent`
(perf_counter_ns and this thread's CPU ns, around the call alone: not the thread hop, not the
publish); the decode worker sums them into the request's `decode_kernel_ms` / `decode_kernel_cpu_ms`
(actors/engine/trace.py) and splits the hop around them (spans.py).

`decode(kernel, state, token, spent)` is a single-state decode step: through the thread's GIL-free
hand-off when the kernel has one (`StepWorker`, call_thread.py) and experts are not paged (the meter
samples in the thread, with the GIL), otherwise `run(clocked(kernel.decode, spent), ...)`. The same
bits, the same `spent` entry; the publish runs on the Trio thread once the step is collected, with
the lock still held (the state is no call's then, and no other call can start).

With paged experts (`meter`, actors/engine/expert_io.py) the thread samples the expert cache's counters
before and after each call: the delta is that call's disk work (calls never overlap). It goes to
the engine-wide totals and, when the caller passes a `tally`, to the caller's sum.
"""

from __future__ import annotations

from functools import partial, wraps
from typing import Any, Callable

import time

import trio

from .call_thread import CallThread
from .errors import single


def _metered(meter, fn: Callable[..., Any]) -> Callable[[], tuple[Any, Any]]:
    def call() -> tuple[Any, Any]:
        before = meter.sample()
        try:
            result = fn()
        finally:
            delta = meter.sample() - before   # an aborted or failed call read bytes too
            meter.record(delta)
        return result, delta
    return call


def clocked(fn: Callable[..., Any], spent: list) -> Callable[..., Any]:
    @wraps(fn)
    def call(*a: Any, **kw: Any) -> Any:
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        try:
            return fn(*a, **kw)
        finally:
            spent.append((t0, time.perf_counter_ns(), time.thread_time_ns() - c0))
    return call


class KernelRunner:
    def __init__(self, abort_flag_factory: Callable[[], Any], meter: Any = None, step_worker: Any = None) -> None:
        self._limiter = trio.CapacityLimiter(1)
        self.thread = CallThread(worker=step_worker)   # step_worker: the kernel's StepWorker(), or None
        self._new_flag = abort_flag_factory
        self.meter = meter            # actors/engine/expert_io.ExpertMeter, or None (no expert cache)
        self.publish: Callable[[tuple], None] | None = None   # (the call's args), kernel thread, after each call

    def _then_publish(self, call: Callable[[], Any], args: tuple) -> Callable[[], Any]:
        publish = self.publish
        if publish is None:
            return call

        def published() -> Any:
            try:
                return call()
            finally:        # an aborted or failed call changed its state too; the limiter is still held
                publish(args)
        return published

    async def run(self, fn: Callable[..., Any], *args: Any, abortable: bool = False, tally: Any = None,
                  **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` in the kernel thread. With `abortable`, `abort=<AbortFlag>` is passed.
        `tally` (expert_io.ExpertTally): gets the call's expert-cache delta when experts are paged."""
        meter = self.meter if self.meter is not None and self.meter.paged else None
        if meter is None:
            return await self._run(fn, args, kwargs, abortable)
        out: list = []

        def bound(*a: Any, **kw: Any) -> Any:
            result, delta = _metered(meter, partial(fn, *a, **kw))()
            out.append(delta)
            return result

        try:
            return await self._run(bound, args, kwargs, abortable)
        finally:
            if tally is not None and out:      # on the Trio thread, once the kernel has let go
                tally.add(out[0])

    async def decode(self, kernel: Any, state: Any, token: int, spent: list, tally: Any = None) -> Any:
        """`kernel.decode(state, token)` in the kernel thread, appending (start, end, CPU) ns to `spent`
        as `clocked` does; without the GIL when it can (the notes)."""
        if self.thread.worker is None or (self.meter is not None and self.meter.paged):
            return await self.run(clocked(kernel.decode, spent), state, token, tally=tally)
        try:
            self._limiter.acquire_nowait()
        except trio.WouldBlock:
            await self._limiter.acquire()
        try:
            ran = self.thread.steps
            try:
                logits, t0, t1, cpu = await self.thread.run_step(state, token)
            finally:       # a step that ran (or failed) and was collected: no call holds the state now
                if self.publish is not None and self.thread.steps != ran:
                    self.publish((state, token))
            spent.append((t0, t1, cpu))
            return logits
        finally:
            self._limiter.release()

    async def _run(self, fn: Callable[..., Any], args: tuple, kwargs: dict, abortable: bool) -> Any:
        if not abortable:
            return await self._in_thread(self._then_publish(partial(fn, *args, **kwargs), args))
        flag = self._new_flag()

        async def watch() -> None:
            try:
                await trio.sleep_forever()
            finally:
                flag.set()

        # The nursery stays inside: an error from the call leaves as itself (a ValueError from the
        # kernel is a ValueError to the caller), a cancel as `Cancelled`, never as an ExceptionGroup.
        error: BaseException | None = None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch)
                try:
                    result = await self._in_thread(self._then_publish(partial(fn, *args, abort=flag, **kwargs), args))
                except Exception as e:       # held until the watcher is gone (it is cancelled below)
                    error = e
                nursery.cancel_scope.cancel()
        except BaseExceptionGroup as eg:     # only `Cancelled` can be left here: the watcher's or ours
            # A kernel error wins over a cancel that raced it: the state may be inconsistent and the
            # caller must know (cancels are level-triggered, so the next checkpoint raises again).
            raise (error if error is not None else single(eg)) from None
        if error is not None:
            raise error
        return result

    async def _in_thread(self, call: Callable[[], Any]) -> Any:
        # The lock without a yield when free (the usual case: the kernel gate already serialises the
        # callers), so the call reaches the thread before any other task runs.
        try:
            self._limiter.acquire_nowait()
        except trio.WouldBlock:
            await self._limiter.acquire()
        try:
            return await self.thread.run_sync(call)
        finally:
            self._limiter.release()

