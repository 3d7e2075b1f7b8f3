"""How a reply ended, decided once: the engine's end (`Done`) and what the output parser found ->
`ReplyEnd`. Every serializer (chat, Anthropic messages, Responses; JSON and streamed) only words it
in its API's terms; none works the outcome out again. Pure.

- `finish`: `length` (the token limit or the context end cut the reply), else `tool_calls` (calls
  were made and every call started closed), else `stop_sequence` (a stop string ended it), else
  `stop` (the end-of-sequence token).
- `tool_calls`: the calls the reply delivers, all closed. A call the output ended inside (cut off)
  or that was malformed is never among them (`dropped`, with why), and with one dropped the finish
  is never `tool_calls`: an agent must not take a reply that lost a call as "run these".

The responders parse with `OutputParser(whole_calls=True)`, so a stream never carried any of a
dropped call either (docs/api.md, "A call cut off by the end of the output").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from .output_parser import OutputParserBase
from .events import Event, Parsed, ToolCall

if TYPE_CHECKING:
    from cairn.actors.engine.messages import Done

Finish = Literal["stop", "stop_sequence", "tool_calls", "length"]
Dropped = Literal["length", "stop_sequence", "stop", "malformed"]


@dataclass(frozen=True)
class ReplyEnd:
    finish: Finish
    tool_calls: tuple[ToolCall, ...] = ()
    stop_sequence: str | None = None   # the stop string, when the finish is `stop_sequence`
    # a call was dropped, and why: the output ended inside it by the token limit (`length`), a stop
    # string (`stop_sequence`) or the end-of-sequence token (`stop`); or its DSML was `malformed`
    dropped: Dropped | None = None

    @property
    def cut_off(self) -> bool:
        """The token limit ended the reply (chat `length`, Anthropic `max_tokens`, Responses `incomplete`)."""
        return self.finish == "length"


def reply_end(finish_reason: str, stop_sequence: str | None, parsed: Parsed) -> ReplyEnd:
    """The engine's finish reason ("stop" | "length") and matched stop string, and the parser's result
    (after `finish`)."""
    dropped: Dropped | None = None
    if parsed.dropped_why == "malformed":
        dropped = "malformed"
    elif parsed.dropped_call:
        dropped = "length" if finish_reason == "length" else "stop_sequence" if stop_sequence is not None else "stop"
    calls = tuple(parsed.tool_calls)
    if finish_reason == "length":
        finish: Finish = "length"
    elif calls and dropped is None:
        finish = "tool_calls"
    elif stop_sequence is not None:
        finish = "stop_sequence"
    else:
        finish = "stop"
    return ReplyEnd(finish, calls, stop_sequence if finish == "stop_sequence" else None, dropped)


def end_reply(parser: OutputParserBase, done: Done) -> tuple[list[Event], ReplyEnd]:
    """Feed the engine's last text, finish the parser: the last events, and how the reply ended."""
    events = parser.feed(done.text_tail) + parser.finish()
    return events, reply_end(done.finish_reason, done.stop_sequence, parser.result)
