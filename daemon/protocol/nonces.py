"""Known per-request nonces: text that clients put into the prompt and change on every conversation.

A prefix cache matches token by token, so a value that changes per conversation near the start of
the prompt makes every new conversation miss the cache from that point on. Such a block is left out
of the rendered prompt when it is metadata, not instructions: a text block that is *wholly* one of
these patterns (a block that merely mentions one is kept). The API logs each drop at debug level;
docs/api.md ("Per-request nonces") lists them. A new one is one line here.
"""

from __future__ import annotations

import re

# name -> a text block that is only this nonce
NONCES: dict[str, re.Pattern] = {
    # Claude Code's `system[0]`: `x-anthropic-billing-header: cc_version=2.1.332.<hash>; cc_entrypoint=cli;`
    # The hash follows the first user message (billing attribution, read by Anthropic's servers only).
    "anthropic-billing-header": re.compile(r"\s*x-anthropic-billing-header:[^\n]*\s*"),
}


def nonce_name(text: str) -> str | None:
    """The nonce this text block wholly is, or None."""
    for name, pattern in NONCES.items():
        if pattern.fullmatch(text):
            return name
    return None
