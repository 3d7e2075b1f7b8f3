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


async def reply(submit: Submit, msg: object) -> bool:
    """Waits for room (a slow client slows its own decode); False when the handler has gone."""
    try:
        await submit.reply.send(msg)
        return True
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return False
