"""Start the engine's actors in one nursery and wire their channels. Returns the edge's inbox.

One engine for any number of slots: admission, the prefill worker, the decode worker and the
checkpoint writer, with `slots` sequences (actors/engine/sequence.py) in the engine; `slots` = 1 runs the
same code with one.

Buffer sizes, and why they are not 0:
- admission inbox: `queue_size + 16` — the HTTP edge must learn "queued" or "429" without waiting on
  a busy actor, and cancels from dying handlers must not stall; admission never blocks, so it drains fast.
- admission -> prefill, prefill -> decode: `slots` — at most one request per slot is admitted at a
  time, so a send there never waits (admission and the prefill worker use send_nowait and rely on it).
- workers -> admission (Finished): 1 per sender clone; a worker sends it after the request ended.
- checkpoint writer: `checkpoint_slots`, at most WRITER_QUEUE — captures queue up while a write runs
  (queued snapshots count against checkpoint memory, so the budget bounds them too).
"""

from __future__ import annotations

from functools import partial

import trio

from .admission import admission
from ..checkpoints.checkpoint_writer import checkpoint_writer
from .decode import decode_worker
from .engine import Engine
from .prefill import prefill_worker
from .sequence import Sequence
from .trim import IdleTrim


WRITER_QUEUE = 8   # disk writes waiting: more only lengthens the lag behind the captures


async def start_engine(nursery: trio.Nursery, engine: Engine, *, queue_size: int, new_stream_decoder, log,
                       checkpoint_slots: int = 4, slots: int = 1, trim: IdleTrim | None = None) -> trio.MemorySendChannel:
    if slots < 1:
        raise ValueError(f"slots: must be at least 1, got {slots}")
    adm_send, adm_recv = trio.open_memory_channel(queue_size + 16)
    pre_send, pre_recv = trio.open_memory_channel(slots)
    dec_send, dec_recv = trio.open_memory_channel(slots)
    ckpt_send, ckpt_recv = trio.open_memory_channel(min(checkpoint_slots, WRITER_QUEUE))
    engine.checkpoints.out = ckpt_send  # captures go out with send_nowait: a full queue drops the write
    engine.slots = [Sequence(i) for i in range(slots)]
    engine.note_slots()

    await nursery.start(partial(checkpoint_writer, ckpt_recv, checkpoints=engine.checkpoints, log=log))
    await nursery.start(partial(decode_worker, dec_recv, adm_send.clone(), engine=engine,
                                new_stream_decoder=new_stream_decoder, log=log))
    await nursery.start(partial(prefill_worker, pre_recv, dec_send, adm_send.clone(), engine=engine, log=log))
    trim = trim or IdleTrim(log)
    await nursery.start(trim.run)
    await nursery.start(partial(admission, adm_recv, pre_send, queue_size=queue_size, log=log,
                                metrics=engine.metrics, slots=slots, note_busy=trim.note))
    return adm_send
