"""Stand-ins the decode worker's tests share: a detokenizer that tags each id, and a drain of the
token ids a request's channel received so far."""

from __future__ import annotations

import trio

from cairn.actors.engine.messages import TokenOut


class TagText:
    """Text of token t is "<t>"; no control token is hidden."""

    def push(self, tok):
        return f"<{tok}>"

    def hidden_text(self, tok):
        return None

    def flush(self):
        return ""


def sent_tokens(recv) -> list[int]:
    """The token ids waiting in `recv`, in order (other messages skipped)."""
    out = []
    while True:
        try:
            msg = recv.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel):
            return out
        if isinstance(msg, TokenOut):
            out.append(msg.token_id)
