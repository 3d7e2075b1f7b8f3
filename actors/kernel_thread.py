"""Run one kernel call in a worker thread, mapping the caller's cancel scope onto an AbortFlag.

Design notes. The thread owns the model state, so it is never abandoned: `trio.to_thread.run_sync`
keeps its default `abandon_on_cancel=False` and one `CapacityLimiter(1)` serialises every kernel
call. A watcher task sleeps beside the call; when the surrounding scope is cancelled its `finally`
sets the abort flag, the kernel returns at its next chunk boundary, the thread call completes and
only then does `Cancelled` propagate. So when this function raises `Cancelled`, the kernel has
stopped and the state is consistent (it holds every completed chunk).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import trio


class KernelRunner:
    def __init__(self, abort_flag_factory: Callable[[], Any]) -> None:
        self._limiter = trio.CapacityLimiter(1)
        self._new_flag = abort_flag_factory

    async def run(self, fn: Callable[..., Any], *args: Any, abortable: bool = False, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` in the kernel thread. With `abortable`, `abort=<AbortFlag>` is passed."""
        if not abortable:
            return await trio.to_thread.run_sync(partial(fn, *args, **kwargs), limiter=self._limiter)
        flag = self._new_flag()

        async def watch() -> None:
            try:
                await trio.sleep_forever()
            finally:
                flag.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            result = await trio.to_thread.run_sync(partial(fn, *args, abort=flag, **kwargs),
                                                   limiter=self._limiter)
            nursery.cancel_scope.cancel()
        return result
