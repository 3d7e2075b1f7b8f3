"""One request's turn in a worker: run it under its cancel scope, then end it the same way everywhere.

Design notes. The prefill and decode workers share this. `attached` runs the work with the request's
`RequestControl` attached, so a client's cancel reaches the running kernel call; a kernel or domain
error — or a bug — fails only this request and discards the live state (it may be inconsistent). A
cancel the request did not ask for is a shutdown: the caller's line is logged and `Cancelled` goes on.
`end_cancelled` / `end_failed` send the acknowledgement or the error, and only then `Finished`, which
is what lets admission hold the engine until the state is consistent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import trio

from .engine import Engine
from .messages import CancelAck, Failed, Finished
from .replies import reply_nowait

EXPECTED_ERRORS = (RuntimeError, ValueError, MemoryError)   # kernel and domain errors (KernelError is a ValueError)


@dataclass
class Turn:
    result: Any = None
    error: str | None = None
    cancelled: bool = False


async def attached(sub, work: Callable[[], Awaitable[Any]], *, engine: Engine, log, stage: str,
                   on_shutdown: Callable[[], None], gone: tuple[type[BaseException], ...] = ()) -> Turn:
    """Run `work()` for `sub`; `gone`: exceptions meaning the client left (treated as a cancel)."""
    turn = Turn()
    with trio.CancelScope() as scope:
        sub.control.attach(scope)
        try:
            turn.result = await work()
        except gone:
            turn.cancelled = True
        except EXPECTED_ERRORS as e:
            turn.error = f"{type(e).__name__}: {e}"
            engine.discard_live()
        except Exception as e:   # a bug must fail this request, not the daemon and its state
            log.exception(f"{stage}_bug", request_id=sub.request_id)
            turn.error = f"internal error: {type(e).__name__}: {e}"
            engine.discard_live()
        except trio.Cancelled:
            if not sub.control.cancel_requested:   # shutdown: say so, then let it through
                on_shutdown()
            raise
    sub.control.detach()
    engine.note_live_tokens()
    turn.cancelled = turn.cancelled or scope.cancelled_caught
    return turn


async def end_cancelled(sub, to_admission: trio.MemorySendChannel, engine: Engine) -> None:
    reply_nowait(sub, CancelAck(sub.request_id))
    await to_admission.send(Finished(sub.request_id, "cancelled"))
    engine.announce(f"idle; {sub.request_id} cancelled")


async def end_failed(sub, error: str, to_admission: trio.MemorySendChannel, engine: Engine, log, stage: str,
                     log_outcome: Callable[[], None]) -> None:
    log.error(f"{stage}_failed", request_id=sub.request_id, error=error)
    log_outcome()
    reply_nowait(sub, Failed(error))
    await to_admission.send(Finished(sub.request_id, "error"))
    engine.announce(f"idle; {sub.request_id} failed")
