"""Admission scheduler actor: FIFO, one request in the engine at a time, 429 when the queue is full.

Inbox (fan-in): `Submit` and `Cancel` from the HTTP edge, `Finished` from the workers. A cancel of a
waiting request answers `CancelAck` at once; a cancel of the running one is forwarded to its
`RequestControl` and the admission stays held until the worker's `Finished`.
"""

from __future__ import annotations

import trio

from .admission_queue import AdmissionQueue
from .messages import Admitted, Cancel, CancelAck, Finished, Rejected, Submit
from .replies import finish


async def admission(inbox: trio.MemoryReceiveChannel, to_prefill: trio.MemorySendChannel, *,
                    queue_size: int, log, metrics=None, task_status=trio.TASK_STATUS_IGNORED) -> None:
    queue: AdmissionQueue[tuple[Submit, float]] = AdmissionQueue(queue_size)
    running: Submit | None = None

    async with inbox, to_prefill:
        task_status.started()
        async for msg in inbox:
            if isinstance(msg, Submit):
                if not queue.offer(msg.request_id, (msg, trio.current_time())):
                    log.info("rejected", request_id=msg.request_id, reason="queue_full", waiting=len(queue))
                    finish(msg, Rejected("queue_full", retry_after_s=1 + len(queue)))
                    if metrics is not None:
                        metrics.requests.inc(outcome="rejected")
            elif isinstance(msg, Cancel):
                waiting = queue.remove(msg.request_id)
                if waiting is not None:
                    log.info("cancelled_while_queued", request_id=msg.request_id)
                    if metrics is not None:
                        metrics.requests.inc(outcome="cancelled")
                        metrics.cancels.inc()
                    finish(waiting[0], CancelAck(msg.request_id))
                elif running is not None and running.request_id == msg.request_id:
                    running.control.cancel()
            elif isinstance(msg, Finished):
                queue.release(msg.request_id)
                if running is not None and running.request_id == msg.request_id:
                    running = None
            else:  # pragma: no cover - wiring error
                raise TypeError(f"admission: unexpected message {msg!r}")

            nxt = queue.admit_next()
            if nxt is not None:
                running, arrived = nxt[1]
                # The prefill worker's inbox has room for exactly one: at most one request is
                # admitted at a time, so this never blocks.
                to_prefill.send_nowait(Admitted(running, arrived))
            if metrics is not None:
                metrics.queue_depth.set(len(queue))
