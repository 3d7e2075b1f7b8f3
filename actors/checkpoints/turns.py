"""Where the messages of a prompt start, read from its token ids alone (capture candidates).

Pure: token ids in, positions out; no tokenizer, no trio.

Design notes
 * A chat template writes each message's start as a special token (DeepSeek: `<｜User｜>`,
   `<｜Assistant｜>`, `<｜tool▁outputs▁begin｜>`; the family names them: daemon/protocol/families.py);
   the tokenizer matches special-token text before its BPE model, so the marker is always a token of
   its own and the position just before it is a token boundary, whether the ids were rendered by
   the daemon, by a client, or sent as text.
 * Two boundaries are worth a checkpoint:
     system_end  the first message start: BOS + system + tools end there, shared by every
                 conversation with that system part (the same position as the chat hint);
     last_user   the last user message's start: the conversation so far, which a retry or an
                 edit of the last message shares.
   The end of sentence closes an assistant turn; the next message's start marker follows it
   directly, so it adds no position of its own.
 * Ids with no markers (plain text, another format) have no structure: no candidates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .disk_format import as_tokens


@dataclass(frozen=True, slots=True)
class TemplateMarkers:
    """The special-token ids that start a message; ``user`` (one of them) starts a user message."""
    message_starts: tuple[int, ...]
    user: int | None


@dataclass(frozen=True, slots=True)
class TurnBoundaries:
    system_end: int | None     # tokens before the first message start
    last_user: int | None      # tokens before the last user message's start


NO_BOUNDARIES = TurnBoundaries(None, None)


def markers_from_vocab(token_to_id, message_starts: Sequence[str], user: str) -> TemplateMarkers | None:
    """The markers a tokenizer knows (``token_to_id(text) -> int | None``) of a family's message-start
    texts (DeepSeek-V4's: daemon/protocol/dsv4/family.py); None without any."""
    starts = tuple(i for i in (token_to_id(t) for t in message_starts) if i is not None)
    if not starts:
        return None
    return TemplateMarkers(starts, token_to_id(user))


def turn_boundaries(prompt: Sequence[int] | np.ndarray, markers: TemplateMarkers | None) -> TurnBoundaries:
    """The system part's end and the last user message's start, as token counts (see the notes).

    A marker at position 0 gives no boundary (nothing precedes it)."""
    if markers is None or not markers.message_starts:
        return NO_BOUNDARIES
    ids = as_tokens(prompt)
    starts = np.flatnonzero(np.isin(ids, np.asarray(markers.message_starts, dtype=ids.dtype)))
    starts = starts[starts > 0]
    if starts.size == 0:
        return NO_BOUNDARIES
    system_end = int(starts[0])
    last_user = None
    if markers.user is not None:
        users = starts[ids[starts] == markers.user]
        if users.size:
            last_user = int(users[-1])
    return TurnBoundaries(system_end, last_user)
