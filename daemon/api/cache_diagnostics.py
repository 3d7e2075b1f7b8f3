"""Cache diagnostics: why a prompt reused less of an earlier one than it could. Pure, but for the
table's lock (the edge fingerprints prompts in a worker thread).

Both vendors let a client name an earlier response and ask why its prompt missed the cache:
Anthropic's `diagnostics: {"previous_message_id": ...}` answered with `diagnostics.cache_miss_reason`,
OpenAI's `prompt_cache_options.comparison_response_id` answered with `prompt_cache_diagnostics`
(docs/api.md, "Cache diagnostics"). cairn knows the exact answer, not an estimate:

- `Fingerprint`: what a later request is compared on. The model; a hash of the system part (the
  leading system/developer messages), of the tools, of the settings that change the rendered prompt
  (thinking mode and effort; the response schema); one hash per later message; and the prompt's
  token ids, extended by the reply's generated ids when the reply table kept them (the next turn's
  prompt then holds exactly those ids). `reusable` is what a later turn can reuse of them: the
  prompt, or where the next turn diverges by design (V4's thinking mode drops the `<think>`), or
  prompt + reply but its EOS (the state after the reply).
- `FingerprintTable`: finished responses' fingerprints by the id the API returned (`msg_…`,
  `resp-…`, `chatcmpl-…`), least recently used out first, bounded in bytes (4 a token id; the memory
  plan's `diagnostics` part) and in entries; an index by the first BLOCK ids finds the earlier turns
  a prompt may extend.
- `compare`: the first divergent token (the exact common prefix of the ids, within the earlier
  response's reusable prefix) and, when the prompt diverges before that prefix ends, which part
  changed first, in the vendors' order: the model, the system part, the tools, the messages (the
  first changed one; a reply re-sent otherwise than it was generated counts as the message after
  the earlier request's), else a setting. A prompt that holds the whole reusable prefix is a hit
  whatever else differs: the ids are what the engine reuses.
- `anthropic_diagnostics` / `openai_diagnostics`: the vendors' documented shapes. cairn's own figures
  (the token, the message, the checkpoint restored, the tokens lost) go to the log and /v1/status.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from array import array
from collections import OrderedDict, deque
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

BLOCK = 64                 # ids hashed for the index: an earlier turn a prompt extends shares its first BLOCK
ENTRY_OVERHEAD = 512       # bytes an entry costs besides its ids (hashes, record, table and index slots)
MAX_ENTRIES = 4096
CANDIDATES = 8             # most recent fingerprints tried per index bucket
RECENT = 32                # misses and shortfalls kept for /v1/status

# What changed first (compare), in the vendors' order; "reasoning" and "text_format" are settings that
# change the rendered prompt, "unknown" a divergence none of the parts explains.
REASONS = ("model_changed", "system_changed", "tools_changed", "messages_changed", "reasoning_changed",
           "text_format_changed", "unknown")
# ...in Anthropic's words (CacheMiss*): settings and the rest are "unavailable", as Anthropic documents
# for thinking, output_config and the like.
ANTHROPIC_REASONS = {"model_changed": "model_changed", "system_changed": "system_changed",
                     "tools_changed": "tools_changed", "messages_changed": "messages_changed"}
# ...in OpenAI's (prompt_cache_diagnostics.reason): the instructions are input.
OPENAI_REASONS = {"model_changed": "model_changed", "system_changed": "input_changed",
                  "tools_changed": "tools_changed", "messages_changed": "input_changed",
                  "reasoning_changed": "reasoning_effort_changed", "text_format_changed": "text_format_changed"}
SYSTEM_ROLES = ("system", "developer")


# --- the ask ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Ask:
    """A request's ask for a comparison with an earlier response."""
    api: str                       # "anthropic" | "openai": the shape of the answer
    compare_to: str | None         # the earlier response's id; None: Anthropic's opt-in on a first turn


# --- fingerprints -----------------------------------------------------------------------------

def _hash(value) -> bytes:
    # key order kept: the encoder renders JSON in the order it was sent, so a reordered schema is a change
    doc = json.dumps(value, ensure_ascii=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(doc.encode(), digest_size=16).digest()


def _block_key(ids: array) -> bytes | None:
    if len(ids) < BLOCK:
        return None
    return hashlib.blake2b(ids[:BLOCK].tobytes(), digest_size=16).digest()


@dataclass(frozen=True, slots=True)
class Fingerprint:
    model: str
    system: bytes
    tools: bytes
    reasoning: bytes               # thinking mode and effort
    text_format: bytes             # the response schema (rendered into the prompt)
    messages: tuple[bytes, ...]    # one hash per message after the system part
    ids: array                     # int32: the prompt's ids (+ the kept reply's generated ids)
    prompt_tokens: int
    reusable: int                  # tokens of `ids` a later turn can reuse

    @property
    def nbytes(self) -> int:
        return ENTRY_OVERHEAD + self.ids.itemsize * len(self.ids) + 16 * len(self.messages)

    def finished(self, reply_ids: Sequence[int] | None) -> "Fingerprint":
        """After the reply: its generated ids (EOS last) when the reply table kept them, so the next
        turn's prompt holds them exactly; the state after the reply holds all but that EOS."""
        if not reply_ids or self.reusable != self.prompt_tokens:
            return self
        ids = array("i", self.ids)
        ids.extend(reply_ids)
        return replace(self, ids=ids, reusable=len(ids) - 1)


def fingerprint(model: str, messages: list, tools: list | None, ids: Sequence[int], *, thinking: bool = False,
                effort: str | None = None, response_schema=None, turn_end: int | None = None) -> Fingerprint:
    """A chat request's fingerprint: `messages` in the chat shape (any API's, after translation),
    `ids` the prompt as the engine runs it, `turn_end` where the next turn diverges by design."""
    k = 0
    while k < len(messages) and isinstance(messages[k], dict) and messages[k].get("role") in SYSTEM_ROLES:
        k += 1
    ids = ids if isinstance(ids, array) and ids.typecode == "i" else array("i", ids)
    return Fingerprint(model=model, system=_hash(messages[:k]), tools=_hash(tools or []),
                       reasoning=_hash([bool(thinking), effort if thinking else None]),
                       text_format=_hash(response_schema), messages=tuple(_hash(m) for m in messages[k:]),
                       ids=ids, prompt_tokens=len(ids), reusable=len(ids) if turn_end is None else int(turn_end))


def common_prefix(a: array, b: array, limit: int | None = None) -> int:
    """Length of the longest common prefix of two id arrays (at most `limit`)."""
    n = min(len(a), len(b), len(a) if limit is None else limit)
    if n <= 0:
        return 0
    x = np.frombuffer(a, dtype=np.int32, count=n)
    y = np.frombuffer(b, dtype=np.int32, count=n)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else n


# --- comparing --------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Comparison:
    compared_to: str
    reason: str | None             # REASONS; None: the prompt holds all it could of the earlier one
    first_divergent_token: int     # ids the two share from the start (the earlier one's reusable prefix at most)
    reusable: int                  # the earlier response's reusable prefix, in tokens
    message_index: int | None = None   # messages_changed: the first message (after the system part) that differs

    @property
    def possible(self) -> int:
        """What this prompt could reuse of the earlier one."""
        return min(self.first_divergent_token, self.reusable)

    @property
    def missed(self) -> int:
        """Tokens of the earlier reusable prefix this prompt cannot reuse (0 on a hit)."""
        return 0 if self.reason is None else self.reusable - self.possible


def compare(prev: Fingerprint, cur: Fingerprint, compared_to: str) -> Comparison:
    first = common_prefix(prev.ids, cur.ids, prev.reusable)
    if first >= min(prev.reusable, len(cur.ids)):
        # the prompt holds the earlier reusable prefix (or is itself a prefix of it): nothing lost
        return Comparison(compared_to, None, first, prev.reusable)
    reason, index = _what_changed(prev, cur, first)
    return Comparison(compared_to, reason, first, prev.reusable, index)


def _what_changed(prev: Fingerprint, cur: Fingerprint, first: int) -> tuple[str, int | None]:
    if prev.model != cur.model:
        return "model_changed", None
    if prev.system != cur.system:
        return "system_changed", None
    if prev.tools != cur.tools:
        return "tools_changed", None
    for i, (a, b) in enumerate(zip(prev.messages, cur.messages)):
        if a != b:
            return "messages_changed", i
    if len(cur.messages) < len(prev.messages):
        return "messages_changed", len(cur.messages)
    if first >= prev.prompt_tokens:
        # inside the earlier reply: re-sent otherwise than it was generated
        return "messages_changed", len(prev.messages)
    if prev.reasoning != cur.reasoning:
        return "reasoning_changed", None
    if prev.text_format != cur.text_format:
        return "text_format_changed", None
    return "unknown", None


# --- the vendors' shapes ----------------------------------------------------------------------

def anthropic_diagnostics(ask: Ask | None, found: bool, cmp: Comparison | None):
    """The Messages API's `diagnostics`: null when not asked, on a first turn or when nothing
    diverged; else {"cache_miss_reason": {...}} (CacheMiss*: `type`, and for the four *_changed
    types `cache_missed_input_tokens`)."""
    if ask is None or ask.compare_to is None:
        return None
    if not found:
        return {"cache_miss_reason": {"type": "previous_message_not_found"}}
    if cmp is None or cmp.reason is None:
        return None
    kind = ANTHROPIC_REASONS.get(cmp.reason)
    if kind is None:
        return {"cache_miss_reason": {"type": "unavailable"}}
    return {"cache_miss_reason": {"type": kind, "cache_missed_input_tokens": cmp.missed}}


def openai_diagnostics(ask: Ask | None, found: bool, cmp: Comparison | None):
    """The Responses API's `prompt_cache_diagnostics`: null when not asked; cache_hit, cache_miss
    (reason, cache_missed_tokens, comparison_reusable_tokens), comparison_response_not_found or
    unavailable."""
    if ask is None or ask.compare_to is None:
        return None
    if not found:
        return {"type": "comparison_response_not_found"}
    if cmp is None:
        return {"type": "unavailable"}
    if cmp.reason is None:
        return {"type": "cache_hit"}
    reason = OPENAI_REASONS.get(cmp.reason)
    if reason is None:
        return {"type": "unavailable"}
    return {"type": "cache_miss", "reason": reason, "cache_missed_tokens": cmp.missed,
            "comparison_reusable_tokens": cmp.reusable}


def vendor_diagnostics(ask: Ask | None, found: bool, cmp: Comparison | None):
    return (anthropic_diagnostics if ask is not None and ask.api == "anthropic" else openai_diagnostics)(
        ask, found, cmp)


# --- the table --------------------------------------------------------------------------------

class FingerprintTable:
    """Response id -> Fingerprint, least recently used out first, at most `max_bytes` (ids + overhead)
    and MAX_ENTRIES; plus the misses and shortfalls /v1/status shows."""

    def __init__(self, max_bytes: int, max_entries: int = MAX_ENTRIES) -> None:
        self.max_bytes = max(0, int(max_bytes))
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, Fingerprint] = OrderedDict()
        self._index: dict[bytes, OrderedDict[str, None]] = {}
        self.bytes = 0
        self.stored = 0
        self.evicted = 0
        self.compared = 0      # comparisons asked for by clients
        self.misses = 0        # ...that found a divergence (or no earlier response)
        self.shortfalls = 0    # requests that reused less than an earlier turn they extend allowed
        self.recent: deque[dict] = deque(maxlen=RECENT)

    def put(self, rid: str, fp: Fingerprint) -> bool:
        if fp.nbytes > self.max_bytes:
            return False
        key = _block_key(fp.ids)
        with self._lock:
            self._drop(rid)
            self._entries[rid] = fp
            self.bytes += fp.nbytes
            self.stored += 1
            if key is not None:
                self._index.setdefault(key, OrderedDict())[rid] = None
            while self.bytes > self.max_bytes or len(self._entries) > self.max_entries:
                self._drop(next(iter(self._entries)))
                self.evicted += 1
        return True

    def _drop(self, rid: str) -> None:
        fp = self._entries.pop(rid, None)
        if fp is None:
            return
        self.bytes -= fp.nbytes
        key = _block_key(fp.ids)
        bucket = self._index.get(key) if key is not None else None
        if bucket is not None:
            bucket.pop(rid, None)
            if not bucket:
                del self._index[key]

    def get(self, rid: str) -> Fingerprint | None:
        with self._lock:
            fp = self._entries.get(rid)
            if fp is not None:
                self._entries.move_to_end(rid)
            return fp

    def extended(self, cur: Fingerprint) -> tuple[str, Fingerprint] | None:
        """The latest earlier turn whose whole reusable prefix `cur` starts with (the longest such
        prefix among the most recent candidates), or None."""
        key = _block_key(cur.ids)
        if key is None:
            return None
        with self._lock:
            bucket = self._index.get(key)
            ids = list(bucket)[-CANDIDATES:] if bucket else []
            cands = [(rid, self._entries[rid]) for rid in ids]
        best = None
        for rid, fp in cands:
            if fp.reusable <= len(cur.ids) and (best is None or fp.reusable > best[1].reusable) \
                    and common_prefix(fp.ids, cur.ids, fp.reusable) >= fp.reusable:
                best = (rid, fp)
        return best

    def __len__(self) -> int:
        return len(self._entries)

    def note(self, event: dict, *, asked: bool, miss: bool, shortfall: bool) -> None:
        with self._lock:
            self.compared += asked
            self.misses += asked and miss
            self.shortfalls += shortfall
            if miss or shortfall:
                self.recent.append({"at": round(time.time(), 3), **event})

    def stats(self) -> dict:
        """For /v1/status."""
        with self._lock:
            return {"entries": len(self._entries), "bytes": self.bytes, "max_bytes": self.max_bytes,
                    "stored": self.stored, "evicted": self.evicted, "compared": self.compared,
                    "misses": self.misses, "shortfalls": self.shortfalls, "recent": list(self.recent)}


# --- one request ------------------------------------------------------------------------------

@dataclass(slots=True)
class Prepared:
    """What the edge knows before the engine runs: the prompt's fingerprint, the client's ask and
    its comparison, and the earlier turn this prompt extends (for the shortfall check)."""
    fp: Fingerprint
    ask: Ask | None = None
    found: bool = False
    asked: Comparison | None = None
    extends: tuple[str, Fingerprint] | None = None

    @property
    def vendor(self):
        """The answer in the asking API's shape (None when nothing was asked)."""
        return vendor_diagnostics(self.ask, self.found, self.asked)


def prepare(table: FingerprintTable, fp: Fingerprint, ask: Ask | None) -> Prepared:
    p = Prepared(fp, ask)
    if ask is not None and ask.compare_to is not None:
        prev = table.get(ask.compare_to)
        p.found = prev is not None
        if prev is not None:
            p.asked = compare(prev, fp, ask.compare_to)
    p.extends = table.extended(fp)
    return p


def outcome(p: Prepared, reused: int, restored: dict | None = None) -> tuple[dict, bool, bool]:
    """The figures of a started request (its `reused` tokens known): (event for the log and
    /v1/status, miss, shortfall). A miss: the client asked and its prompt diverged (or the earlier
    response is not known); a shortfall: the prompt extends an earlier turn whose reusable prefix
    the engine did not reuse in full (an evicted checkpoint, a live state taken by another
    conversation)."""
    ev: dict = {"prompt_tokens": p.fp.prompt_tokens, "reused_tokens": reused}
    shortfall = False
    cmp = p.asked
    not_found = p.ask is not None and p.ask.compare_to is not None and not p.found
    miss = not_found
    if cmp is None and p.extends is not None:
        rid, prev = p.extends
        cmp = Comparison(rid, None, common_prefix(prev.ids, p.fp.ids, prev.reusable), prev.reusable)
    if cmp is not None:
        miss = miss or cmp.reason is not None
        ev.update(compared_to=cmp.compared_to, reason=cmp.reason, first_divergent_token=cmp.first_divergent_token,
                  reusable_tokens=cmp.reusable, possible_tokens=cmp.possible,
                  tokens_lost=max(0, cmp.possible - reused))
        if cmp.message_index is not None:
            ev["message_index"] = cmp.message_index
        if cmp.reason is not None:
            ev["cache_missed_tokens"] = cmp.missed
        shortfall = cmp.reason is None and reused < cmp.possible
    if not_found:  # the earlier response asked for is not known (the figures, if any: the turn it extends)
        ev.update(compared_to=p.ask.compare_to, reason="not_found")
        if cmp is not None:
            ev["extends"] = cmp.compared_to
    if restored:
        ev["restored"] = restored
    return ev, miss, shortfall
