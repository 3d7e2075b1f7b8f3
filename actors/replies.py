"""Sending to a request's reply channel when its HTTP handler may already be gone."""

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
