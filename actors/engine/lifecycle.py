"""One request's turn in a worker: run it under its cancel scope, then end it the same way everywhere.

Design notes. The prefill and decode workers share this. `attached` runs the work with the request's
`RequestControl` attached, so a client's cancel reaches the running kernel call; a kernel or domain
error — or a bug — fails only this request and discards its sequence's state (it may be inconsistent). A
cancel the request did not ask for is a shutdown: the caller's line is logged, the request is ended
with `CancelAck(reason="shutdown")` (so its handler answers at once) and `Cancelled` goes on.
`end_cancelled` / `end_failed` end the request with the acknowledgement or the error (replies.finish:
recorded, then the reply channel closed — never lost to a full buffer), then free the request's
slot (`Engine.release`), and only then send `Finished`, which is what lets admission hold the
slot until the state is consistent.

The work's components keep their nurseries inside (kernel_thread.py), so an error arrives here as
itself; a group that still leaks is reduced to its single leaf, so `ValueError` from a kernel call is
reported as `ValueError`, and a group of `Cancelled` is a cancel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import trio

from .engine import Engine
from .errors import single
from .memory_guard import MemoryExceeded
from .sequence import Sequence
from .messages import CancelAck, Failed, Finished
from .replies import finish

EXPECTED_ERRORS = (RuntimeError, ValueError, MemoryError)   # kernel and domain errors (KernelError is a ValueError)


@dataclass
class Turn:
    result: Any = None
    error: str | None = None
    cancelled: bool = False
    cancel_reason: str = "client"      # CancelAck.reason when `cancelled`
    error_kind: str = "engine"         # Failed.kind when `error`: "memory" for MemoryExceeded


class ClientGone(Exception):
    """Raised by work that finds its client gone: the handler left, or it stopped reading (`stalled`)."""

    def __init__(self, stalled: bool = False) -> None:
        super().__init__("the client stopped reading" if stalled else "the client has gone")
        self.stalled = stalled


async def attached(sub, work: Callable[[], Awaitable[Any]], *, engine: Engine, seq: Sequence, log, stage: str,
                   on_shutdown: Callable[[], None]) -> Turn:
    """Run `work()` for `sub`; a `ClientGone` from it is treated as a cancel."""
    turn = Turn()
    with trio.CancelScope() as scope:
        sub.control.attach(scope)
        try:
            try:
                turn.result = await work()
            except BaseExceptionGroup as eg:
                one = single(eg)
                if one is eg:
                    raise
                raise one from None
        except ClientGone as e:
            turn.cancelled = True
            turn.cancel_reason = "stalled" if e.stalled else "client"
        except MemoryExceeded as e:      # raised before the kernel call; the state goes to free its memory
            turn.error, turn.error_kind = str(e), "memory"
            engine.discard(seq)
        except EXPECTED_ERRORS as e:
            turn.error = f"{type(e).__name__}: {e}"
            engine.discard(seq)
        except trio.Cancelled:
            if not sub.control.cancel_requested:   # shutdown: say so, end the request, then let it through
                on_shutdown()
                finish(sub, CancelAck(sub.request_id, "shutdown"))
            raise
        except Exception as e:   # a bug must fail this request, not the daemon and its state
            log.exception(f"{stage}_bug", request_id=sub.request_id)
            turn.error = f"internal error: {type(e).__name__}: {e}"
            engine.discard(seq)
    sub.control.detach()
    engine.note_live_tokens()
    turn.cancelled = turn.cancelled or scope.cancelled_caught
    return turn


async def end_cancelled(sub, seq: Sequence, to_admission: trio.MemorySendChannel, engine: Engine,
                        reason: str = "client") -> None:
    finish(sub, CancelAck(sub.request_id, reason))
    engine.release(seq)
    await to_admission.send(Finished(sub.request_id, "cancelled"))
    engine.announce(f"idle; {sub.request_id} cancelled")


async def end_failed(sub, seq: Sequence, error: str, to_admission: trio.MemorySendChannel, engine: Engine, log,
                     stage: str, log_outcome: Callable[[], None], kind: str = "engine") -> None:
    log.error(f"{stage}_failed", request_id=sub.request_id, error=error, kind=kind)
    log_outcome()
    finish(sub, Failed(error, kind))
    engine.release(seq)
    await to_admission.send(Finished(sub.request_id, "error"))
    engine.announce(f"idle; {sub.request_id} failed")
