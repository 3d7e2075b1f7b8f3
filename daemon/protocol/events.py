"""What every family's output parser emits and returns (daemon/protocol/families.py): the events a
reply streams (reasoning, content, a tool call's start and arguments) and the parsed whole. The API
responders read only these; each family's parser (DeepSeek-V4's dsv4/output.py, Qwen3.5's
qwen35/output.py) produces them from its own format."""

from __future__ import annotations

from dataclasses import dataclass, field


class _Pieces:
    """A string that grows piece by piece, joined when read: `obj.s += piece` on an attribute copies
    the whole string each time (quadratic over a long streamed value)."""

    def __init__(self, text: str = "") -> None:
        self._parts = [text] if text else []

    def add(self, piece: str) -> None:
        self._parts.append(piece)

    def text(self) -> str:
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""


class ToolCall:
    def __init__(self, id: str, name: str, arguments: str = "") -> None:
        self.id, self.name = id, name
        self._arguments = _Pieces(arguments)

    @property
    def arguments(self) -> str:
        return self._arguments.text()

    def __eq__(self, other) -> bool:
        return isinstance(other, ToolCall) and (self.id, self.name, self.arguments) == \
            (other.id, other.name, other.arguments)

    def __repr__(self) -> str:
        return f"ToolCall(id={self.id!r}, name={self.name!r}, arguments={self.arguments!r})"


@dataclass
class Event:
    kind: str              # "reasoning" | "content" | "tool_start" | "tool_args"
    text: str = ""         # reasoning / content text, or an arguments fragment
    index: int = 0         # tool call index
    id: str = ""
    name: str = ""


@dataclass
class Parsed:
    tool_calls: list[ToolCall] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    dropped_call: bool = False    # a call was started but never closed (cut off): it is not a call
    dropped_why: str | None = None    # "cut_off" (the output ended inside it) | "malformed"
    _reasoning: _Pieces = field(default_factory=_Pieces, repr=False)
    _content: _Pieces = field(default_factory=_Pieces, repr=False)

    @property
    def reasoning(self) -> str:
        return self._reasoning.text()

    @property
    def content(self) -> str:
        return self._content.text()
