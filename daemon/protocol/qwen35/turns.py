"""Where Qwen3.5's messages start, read from the prompt's token ids alone (checkpoint candidates).

Pure: token ids in, positions out. The same two boundaries as V4's (actors/checkpoints/turns.py):
`system_end` (the system part, tools included, shared by every conversation with it) and
`last_user` (the last user message's start). What differs is the marker: Qwen opens every turn
with `<|im_start|>` and the role as ordinary text, so a user start is two tokens or more
(`<|im_start|>`, `user`, `\\n`), and a tool result is a user turn too (`<|im_start|>user\\n<tool_response>`),
which is not a user message: it does not count as one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from cairn.actors.checkpoints.turns import NO_BOUNDARIES, TurnBoundaries
from cairn.actors.checkpoints.disk_format import as_tokens

from .markers import IM_START, TOOL_RESPONSE


@dataclass(frozen=True, slots=True)
class TurnMarkers:
    start: int                    # `<|im_start|>`
    system: tuple[int, ...]       # the ids of "system\n" after it
    user: tuple[int, ...]         # the ids of "user\n" after it
    tool_response: int | None     # `<tool_response>`: a user turn that starts so is a tool result


def turn_markers(tokenizer) -> TurnMarkers | None:
    """The markers of a tokenizer (`token_to_id`, `encode(text) -> ids`); None without `<|im_start|>`."""
    start = tokenizer.token_to_id(IM_START)
    if start is None:
        return None
    return TurnMarkers(start, tuple(tokenizer.encode("system\n")), tuple(tokenizer.encode("user\n")),
                       tokenizer.token_to_id(TOOL_RESPONSE))


def _follows(ids: np.ndarray, at: int, seq: tuple[int, ...]) -> bool:
    return at + len(seq) <= len(ids) and tuple(int(t) for t in ids[at:at + len(seq)]) == seq


def turn_boundaries(prompt: Sequence[int] | np.ndarray, markers: TurnMarkers | None) -> TurnBoundaries:
    """The system part's end (only when the prompt opens with a system turn) and the last user
    message's start, as token counts. A turn start at position 0 is no boundary."""
    if markers is None:
        return NO_BOUNDARIES
    ids = as_tokens(prompt)
    starts = np.flatnonzero(ids == markers.start)
    if starts.size == 0:
        return NO_BOUNDARIES
    system_end = None
    if starts[0] == 0 and _follows(ids, 1, markers.system) and starts.size > 1:
        system_end = int(starts[1])
    last_user = None
    for s in starts[::-1]:
        s = int(s)
        after = s + 1 + len(markers.user)
        if s > 0 and _follows(ids, s + 1, markers.user) and \
                not (after < len(ids) and markers.tool_response is not None and ids[after] == markers.tool_response):
            last_user = s
            break
    return TurnBoundaries(system_end, last_user)
