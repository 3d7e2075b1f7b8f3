"""Sending to a request's reply channel when its HTTP handler may already be gone.

Every request ends with exactly one `finish`: its terminal reply is recorded on the request's
`RequestControl` (so it cannot be lost to a full buffer), offered to the channel, and the channel
is closed. The handler's `async for` over the replies therefore always ends, and it takes the
terminal reply from the channel or, when the buffer had no room for it, from `control.final`.
"""

from __future__ import annotations

import trio

from .messages import Submit


def reply_nowait(submit: Submit, msg: object) -> bool:
    """Best effort, never blocks: False when the handler has gone (or is not reading)."""
    try:
        submit.reply.send_nowait(msg)
        return True
    except (trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock):
        return False


def finish(submit: Submit, msg: object) -> None:
    """End the request with its terminal reply `msg`. Never blocks; safe inside a cancelled scope."""
    if submit.control.final is None:          # the first end wins (a shutdown after a Done changes nothing)
        submit.control.final = msg
        reply_nowait(submit, msg)
    submit.reply.close()


# A client that keeps its connection open but stops reading would otherwise hold the engine for
# everyone; after this long without room in its reply buffer it is treated as gone (cancelled).
STALL_S = 120.0


async def reply(submit: Submit, msg: object, *, stall_s: float = STALL_S) -> bool:
    """Waits for room (a slow client slows its own decode); False when the handler has gone or the
    client has not read anything for `stall_s` seconds."""
    try:
        with trio.move_on_after(stall_s):
            await submit.reply.send(msg)
            return True
        return False
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return False
