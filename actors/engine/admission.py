"""Admission actor: FIFO, one request per slot in the engine at a time (one slot by default), 429 when
the queue is full.

Inbox (fan-in): `Submit` and `Cancel` from the HTTP edge, `Finished` from the workers. A cancel of a
waiting request answers `CancelAck` at once; a cancel of the running one is forwarded to its
`RequestControl` and its admission stays held until the worker's `Finished`.
"""

from __future__ import annotations

import trio

from .admission_queue import AdmissionQueue
from .messages import Admitted, Cancel, CancelAck, Finished, Rejected, Submit
from .replies import finish


async def admission(inbox: trio.MemoryReceiveChannel, to_prefill: trio.MemorySendChannel, *,
                    queue_size: int, log, metrics=None, slots: int = 1, note_busy=lambda busy: None,
                    task_status=trio.TASK_STATUS_IGNORED) -> None:
    queue: AdmissionQueue[tuple[Submit, float]] = AdmissionQueue(queue_size, slots)
    running: dict[str, Submit] = {}

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
                elif msg.request_id in running:
                    running[msg.request_id].control.cancel()
            elif isinstance(msg, Finished):
                queue.release(msg.request_id)
                running.pop(msg.request_id, None)
            else:  # pragma: no cover - wiring error
                raise TypeError(f"admission: unexpected message {msg!r}")

            while (nxt := queue.admit_next()) is not None:
                sub, arrived = nxt[1]
                running[sub.request_id] = sub
                # The next actor's inbox has room for `slots`: at most that many requests are
                # admitted at a time, so this never blocks.
                to_prefill.send_nowait(Admitted(sub, arrived))
            if metrics is not None:
                metrics.queue_depth.set(len(queue))
            note_busy(bool(running) or len(queue) > 0)   # idle: actors/engine/trim.py gives freed heap back
