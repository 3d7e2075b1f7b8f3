"""Replies reused exactly: the ids the model generated for a reply, replayed when a later prompt
holds that reply again. Pure, but for the table's lock (the edge renders prompts in a thread).

An agent re-sends the model's reply in its next turn, as the API returned it: text, reasoning, tool
calls. Rendered and tokenized again, that text often gives other ids than the model generated (its
own tokenization, the whitespace before the DSML block, parameter formatting), so the next prompt
would leave the state after turn 1 at the reply's first differing token and recompute the rest.
Here, instead:

- `ReplyTable`: for each reply that ended with the end-of-sentence token (no length cut, no stop
  string, no call dropped or malformed), the ids the model generated — from just after the prompt's
  `<｜Assistant｜><think>` or `<｜Assistant｜></think>` (the *opener*) to its EOS — keyed by a hash of
  what the API returned (`reply_key`). LRU, bounded in bytes (the memory plan's `replies` part).
- `replay`: a rendered prompt's past assistant turns whose message's key is in the table get those
  ids in place of their tokenized text, when the turn is rendered where and as the reply was
  generated (the same opener right before it, the exact text of that message between opener and
  EOS). The prompt then starts with the state after turn 1 (prompt + reply), which the live state
  or the reply-end checkpoint holds (actors/engine/decode.py).

The key: sha256 of the message's content text (text parts joined as the encoder joins them),
reasoning text, and per tool call its id, name and arguments as the encoder reads them
(`dsv4.encoding.dsml_arguments`: a JSON-object string parsed, keys in their order; anything else
kept raw). So a message that would render differently has another key, and one byte of difference
in content, reasoning, an id, a name or an argument value misses. A miss is only a miss: the
prompt is the tokenized text, as without the table.

How a turn is found: each closed past assistant turn renders exactly one EOS, so the k-th EOS of
the prompt closes the k-th closed assistant message (when the prompt holds any other EOS id, the
counts differ and nothing is replayed). From that EOS back, the turn's text must be exactly what
the encoder writes for the message after its opener, at a token boundary, with the opener and
`<｜Assistant｜>` right before it. Linear in the prompt.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import threading
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, Sequence

from .chat import join_parts
from .dsv4.encoding import END_THINK, EOS, dsml_arguments, render_tool_calls

KEY_VERSION = "cairn-reply-v1"
ENTRY_OVERHEAD = 256          # bytes an entry costs besides its ids (key, record, table slot)


# --- keys -------------------------------------------------------------------------------------

def reply_key(content: str, reasoning: str, calls: Iterable[tuple[str, str, object]]) -> bytes:
    """The key of an assistant message: content, reasoning, and (id, name, arguments) per call."""
    doc = [KEY_VERSION, content, reasoning, [[cid, name, dsml_arguments(args)] for cid, name, args in calls]]
    # ensure_ascii: every string escaped the same way, lone surrogates included (a hash input only)
    return hashlib.sha256(json.dumps(doc, ensure_ascii=True, separators=(",", ":")).encode()).digest()


def content_text(content) -> str:
    """A message's content as the encoder reads it: None is "", text parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return join_parts([p["text"] for p in content])


def reasoning_text(m: dict) -> str:
    r = m.get("reasoning_content")
    if r is None:
        r = m.get("reasoning")
    return r or ""


def message_calls(m: dict) -> list[tuple[str, str, object]]:
    return [(c.get("id") or "", c["function"]["name"], c["function"].get("arguments", "{}"))
            for c in m.get("tool_calls") or []]


def message_key(m: dict) -> bytes:
    """The key of a chat assistant message as a request holds it (any API's, after translation)."""
    return reply_key(content_text(m.get("content")), reasoning_text(m), message_calls(m))


def parsed_key(parsed, omit_reasoning: bool = False) -> bytes:
    """The key of a reply as the output parser read it (dsv4.output.Parsed): what every API returns
    (without the reasoning where the API omitted it: Anthropic's `thinking.display: "omitted"`)."""
    return reply_key(parsed.content, "" if omit_reasoning else parsed.reasoning,
                     [(c.id, c.name, c.arguments) for c in parsed.tool_calls])


# --- the table --------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class StoredReply:
    opener: int          # the prompt's last id when the reply was generated: `<think>` or `</think>`
    ids: array           # int32: the generated ids, the final EOS included

    @property
    def nbytes(self) -> int:
        return ENTRY_OVERHEAD + self.ids.itemsize * len(self.ids)


class ReplyTable:
    """Key -> StoredReply, least recently used out first, at most `max_bytes` (ids + overhead)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max(0, int(max_bytes))
        self._lock = threading.Lock()
        self._entries: OrderedDict[bytes, StoredReply] = OrderedDict()
        self.bytes = 0
        self.stored = 0        # puts kept
        self.evicted = 0
        self.replayed = 0      # assistant turns rendered with their generated ids
        self.replayed_tokens = 0

    def put(self, key: bytes, opener: int, ids: Sequence[int]) -> bool:
        """Keep `ids` for `key` (replacing an older entry); False when one entry exceeds the budget."""
        entry = StoredReply(int(opener), array("i", ids))
        if entry.nbytes > self.max_bytes:
            return False
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= old.nbytes
            self._entries[key] = entry
            self.bytes += entry.nbytes
            self.stored += 1
            while self.bytes > self.max_bytes:
                _, gone = self._entries.popitem(last=False)
                self.bytes -= gone.nbytes
                self.evicted += 1
        return True

    def get(self, key: bytes) -> StoredReply | None:
        """The entry for `key`, now the most recently used (None: not kept)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def __len__(self) -> int:
        return len(self._entries)

    def note_replayed(self, turns: int, tokens: int) -> None:
        with self._lock:
            self.replayed += turns
            self.replayed_tokens += tokens

    def stats(self) -> dict:
        """For /v1/status."""
        with self._lock:
            return {"entries": len(self._entries), "bytes": self.bytes, "max_bytes": self.max_bytes,
                    "stored": self.stored, "evicted": self.evicted, "replayed_turns": self.replayed,
                    "replayed_tokens": self.replayed_tokens}


# --- replay -----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Marks:
    """The ids replay reads: `<｜Assistant｜>`, `<think>`, `</think>`, EOS."""
    assistant: int
    think: int
    end_think: int
    eos: int


def reply_marks(tokenizer, renderer) -> Marks | None:
    """The ids of `tokenizer`, when `renderer` is V4's own encoding (the rendering `replay` checks
    against) and the vocabulary has every one; else None: no replay."""
    from .chat_encoding import V4Renderer
    from .dsv4.encoding import ASSISTANT, THINK

    if not isinstance(renderer, V4Renderer):
        return None
    ids = [tokenizer.token_to_id(t) for t in (ASSISTANT, THINK, END_THINK)]
    eos = getattr(tokenizer, "eos_id", None)
    if None in ids or eos is None or tokenizer.token_to_id(EOS) != eos:
        return None
    return Marks(*ids, eos)


def keepable(parsed, end, ids: Sequence[int], eos: int) -> bool:
    """Whether a finished reply's ids may be kept: it ended with EOS by itself (`end`, reply_end's
    decision: not cut by the length, not ended by a stop string) and the parser dropped nothing and
    found nothing malformed, so what the API returned is the whole of what the ids say."""
    return (bool(ids) and ids[-1] == eos and end.finish in ("stop", "tool_calls") and end.dropped is None
            and not parsed.dropped_call and not parsed.warnings)


@dataclass(frozen=True, slots=True)
class Replayed:
    ids: list[int]
    spans: tuple[tuple[int, int, int], ...]   # (start, end, new length) replaced, in the old ids' positions

    def position(self, n: int | None) -> int | None:
        """A token count of the old ids (a boundary) in the new ids; None inside a replaced span."""
        if n is None:
            return None
        delta = 0
        for start, end, new in self.spans:
            if n <= start:
                break
            if n < end:
                return None
            delta += new - (end - start)
        return n + delta

    @property
    def tokens(self) -> int:
        """Generated ids the prompt now holds in place of tokenized text."""
        return sum(new for _, _, new in self.spans)


def _closed_assistants(messages: list[dict]) -> list[dict]:
    """The assistant messages the encoder closes with EOS: all but a final open one (continued)."""
    out = [m for m in messages if isinstance(m, dict) and m.get("role") == "assistant"]
    last = messages[-1] if messages else None
    if (out and out[-1] is last and not last.get("tool_calls")
            and content_text(last.get("content"))):
        out.pop()
    return out


def _turn_text(m: dict, opener: int, marks: Marks) -> bytes:
    """What the encoder writes for this message after its opener, EOS included."""
    calls = [{"name": name, "arguments": args} for _, name, args in message_calls(m)]
    text = ((reasoning_text(m) + END_THINK if opener == marks.think else "") + content_text(m.get("content"))
            + (render_tool_calls(calls) if calls else "") + EOS)
    return text.encode()


def replay(ids: Sequence[int], ends: Sequence[int], data: bytes, messages: list[dict], table: ReplyTable,
           marks: Marks) -> Replayed | None:
    """`ids` (the tokenized prompt; `ends[i]` = the UTF-8 byte offset in `data` where token i ends)
    with each past assistant turn whose message is in `table` replaced by its generated ids (see the
    module notes). None when nothing was replaced."""
    closed = _closed_assistants(messages)
    if not closed or not len(table):
        return None
    found = [(k, table.get(message_key(m))) for k, m in enumerate(closed)]
    found = [(k, e) for k, e in found if e is not None]
    if not found:
        return None
    eos_at = [i for i, t in enumerate(ids) if t == marks.eos]
    if len(eos_at) != len(closed):
        return None      # an EOS id that closes no assistant turn: which is which is not known
    spans = []
    for k, entry in found:
        e = eos_at[k]
        text = _turn_text(closed[k], entry.opener, marks)
        stop = ends[e]
        begin = stop - len(text)
        if begin < 0 or data[begin:stop] != text:
            continue      # not rendered as it was generated (another mode, another opener)
        j = bisect.bisect_left(ends, begin)           # the token ending where the turn's text begins
        if j >= len(ends) or ends[j] != begin or j < 1:
            continue
        start = j + 1
        if ids[j] != entry.opener or ids[j - 1] != marks.assistant or (k and start <= eos_at[k - 1]):
            continue
        spans.append((start, e + 1, entry))
    if not spans:
        return None
    out: list[int] = []
    at = 0
    for start, end, entry in spans:
        out.extend(ids[at:start])
        out.extend(entry.ids)
        at = end
    out.extend(ids[at:])
    result = Replayed(out, tuple((s, e, len(entry.ids)) for s, e, entry in spans))
    table.note_replayed(len(spans), result.tokens)
    return result
