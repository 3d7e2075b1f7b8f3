"""Scheduler actor (slots > 1): several requests in the engine at once, one live state each.

Design notes. It replaces the prefill and decode workers when the engine has more than one slot
(with one slot the daemon runs exactly as before). Admission admits up to `len(slots)` requests;
for each the scheduler picks a slot (slot_policy.py: the longest live prefix of the prompt, else
the least recently used idle slot) and runs the request in its own task: the same prefill turn and
decode turn as the single-slot workers (prefill.prefill_turn, decode.decode_turn), with the slot
in place of the engine. Continuous batching comes from the slot's kernel calls: every decode step
goes through the shared `DecodeBatcher` (one `decode_batch` call for all decoding sequences) and
every prefill chunk and decode step through the `KernelGate` (decode first, then the shortest
remaining prefill), so sequences join and leave the batch between steps.

Guarantees kept per sequence: a request's cancel stops only its own kernel work (its prefill chunk
is aborted at the chunk boundary; its decode token is withdrawn, or the running step finishes
first) and is acknowledged before its slot is released (`Finished` goes out through
`_SlotRelease`, which frees the slot first); a kernel error discards only the states of the
sequences it touched; every request ends through replies.finish in those turns.
"""

from __future__ import annotations

import numpy as np
import trio

from .decode import decode_turn
from .messages import Admitted
from .prefill import prefill_turn
from .slot_policy import choose_slot


class _SlotRelease:
    """The channel to admission as a turn sees it: the slot is idle again before `Finished` is sent,
    so the next admitted request finds it free."""

    def __init__(self, slot, to_admission: trio.MemorySendChannel) -> None:
        self._slot, self._out = slot, to_admission

    async def send(self, msg) -> None:
        self._slot.release()
        await self._out.send(msg)


async def scheduler(inbox: trio.MemoryReceiveChannel, to_admission: trio.MemorySendChannel, *, slots, batcher,
                    new_stream_decoder, log, task_status=trio.TASK_STATUS_IGNORED) -> None:
    batcher.decoding = lambda: sum(1 for s in slots if s.phase == "decode")

    async def serve(adm: Admitted, slot) -> None:
        release = _SlotRelease(slot, to_admission)
        pre = await prefill_turn(adm, release, engine=slot, log=log)
        if pre is None:
            return
        slot.set_phase("decode")
        await decode_turn(pre, release, engine=slot, new_stream_decoder=new_stream_decoder, log=log)

    async with inbox, to_admission, trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        task_status.started()
        async for adm in inbox:
            sub = adm.submit
            choice = choose_slot([s.view() for s in slots], np.asarray(sub.prompt, dtype=np.int32))
            if choice is None:   # pragma: no cover - admission admits at most len(slots)
                raise RuntimeError("scheduler: a request was admitted with every slot busy")
            slot = slots[choice.index]
            slot.take(sub.request_id, len(sub.prompt))
            log.info("slot_assigned", request_id=sub.request_id, slot=slot.index, shared_tokens=choice.shared)
            nursery.start_soon(serve, adm, slot)
        nursery.cancel_scope.cancel()   # the inbox closed: the engine is stopping
