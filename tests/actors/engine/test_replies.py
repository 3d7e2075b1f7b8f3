"""A client that stays connected but stops reading must not hold the engine forever."""

from __future__ import annotations

import trio

from cairn.actors.engine.replies import STALL_S, reply


class _Sub:
    def __init__(self, send) -> None:
        self.reply = send


async def test_reply_gives_up_on_a_client_that_stopped_reading(autojump_clock):
    send, recv = trio.open_memory_channel(1)
    sub = _Sub(send)
    assert await reply(sub, "token 1")                  # room in the buffer
    t0 = trio.current_time()
    assert not await reply(sub, "token 2")              # nobody reads: treated as gone after the stall limit
    assert trio.current_time() - t0 == STALL_S
    assert recv.receive_nowait() == "token 1"
    assert await reply(sub, "token 3")                  # a reader again: delivered


async def test_reply_to_a_closed_handler_is_false_at_once():
    send, recv = trio.open_memory_channel(1)
    await recv.aclose()
    assert not await reply(_Sub(send), "x")
