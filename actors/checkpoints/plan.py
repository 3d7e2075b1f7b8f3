"""Prefill planning: extend the live state, restore a checkpoint, or start fresh; where to capture.

Pure policy: reads the store, never changes it, no I/O, no trio.

Design notes
 * Candidates and their worth, in prefill tokens saved:
     live state   its length L, if the prompt starts with (or equals) its tokens; cost 0;
     checkpoint   its length C (the longest stored prefix), minus ``restore_cost_tokens``.
   The best positive worth wins; ties go to the live state. Equal length is usable in both cases
   because the kernel keeps the last logits in the state and in every snapshot, so decode can
   sample without re-running the last prompt token.
 * Capture points are positions strictly inside the prompt where the prefill loop snapshots the
   state when it gets there (``pieces`` cuts the chunks there, so nothing is recomputed):
     "system"  rule 1: the gateway's hint, the token boundary where BOS + system + tools end;
     "common"  rule 1b (``turn_tokens``): where the last user message starts, read from the
               template's markers in the ids (turns.py) — the conversation so far; only when it
               is at least min_tokens past the start (more than a reply past a restored prefix);
     "common"  rule 2: the longest common token prefix with the previous fresh prompt.
   The system boundary comes from the chat renderer or, for any prompt, from the markers (turns.py),
   so a chat request and the same conversation sent as token ids capture at the same positions.
   Each must be >= min_tokens, more than tail_guard tokens before the prompt end, strictly after
   the start position, and not stored yet. Rule 3, the prompt end, is a flag: capture after the
   prefill when the prompt is >= min_tokens and not stored yet.
 * Rule 3': when the gateway says where the next turn's prompt will diverge (``turn_end_tokens``,
   before the end: V4's thinking mode ends a prompt with `<think>`, which the next turn renders as
   `</think>`), the prompt-end capture is taken there instead (kind "prompt_end", a capture point
   inside the prompt), exempt from tail_guard.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Literal, Sequence

import numpy as np

from .disk_format import as_tokens
from .store import CheckpointStore, Entry

Action = Literal["reuse_live", "restore", "fresh"]


@dataclass(frozen=True, slots=True)
class CapturePoint:
    position: int  # tokens in the state when the snapshot is taken
    kind: str      # "system" | "common" | "prompt_end" (at the turn end, rule 3')


@dataclass(frozen=True, slots=True)
class PrefillPlan:
    action: Action
    start: int                             # tokens in the state after the action; prefill start..end
    end: int                               # len(prompt)
    restore_id: str | None                 # entry to restore when action == "restore"
    captures: tuple[CapturePoint, ...]     # sorted by position, start < position < end
    capture_prompt_end: bool               # snapshot after the prefill (rule 3)
    live_miss: str | None                  # why the live state was not used (None if it was)
    store_miss: str | None                 # why no checkpoint was restored (None if one was)
    skipped: tuple[str, ...] = ()          # capture candidates rejected, for the log

    @property
    def reused_tokens(self) -> int:
        return self.start

    @property
    def capture_positions(self) -> tuple[int, ...]:
        return tuple(c.position for c in self.captures)

    def describe(self) -> str:
        """One log phrase: what was reused and, on a miss, why."""
        head = {"reuse_live": f"reuse live state: {self.start}/{self.end} tokens",
                "restore": f"restore checkpoint {self.restore_id}: {self.start}/{self.end} tokens",
                "fresh": f"fresh prefill of {self.end} tokens"}[self.action]
        why = "; ".join(m for m in (self.live_miss and f"live: {self.live_miss}",
                                    self.store_miss and f"store: {self.store_miss}") if m)
        return f"{head} ({why})" if why and self.action != "reuse_live" else head


def common_prefix_len(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> int:
    """Length of the longest common prefix of two token sequences."""
    x, y = as_tokens(a), as_tokens(b)
    n = min(x.shape[0], y.shape[0])
    diff = np.flatnonzero(x[:n] != y[:n])
    return int(diff[0]) if diff.size else n


def plan_prefill(prompt: Sequence[int] | np.ndarray, live_tokens: Sequence[int] | np.ndarray | None,
                 store: CheckpointStore, *, hint_tokens: int | None = None,
                 turn_tokens: int | None = None,
                 previous_fresh_prompt: Sequence[int] | np.ndarray | None = None,
                 min_tokens: int = 512, tail_guard: int = 8,
                 restore_cost_tokens: int | Callable[[Entry], int] = 64,
                 turn_end_tokens: int | None = None, exclude: frozenset[str] = frozenset()) -> PrefillPlan:
    """Decide how to bring the state to ``prompt`` (see the module notes).

    ``live_tokens``: the ids the live state holds (None or empty: no live state).
    ``hint_tokens``: the system-prefix token boundary; the caller has checked that those ids are
    the prompt's first ids. ``turn_tokens``: where the last user message starts (turns.py), captured
    as a "common" prefix. ``previous_fresh_prompt``: the last prompt whose plan was not
    "reuse_live" (the caller keeps it: set it to ``prompt`` unless this plan reuses the live state). ``restore_cost_tokens``: what a restore costs, in prefill tokens, as a number
    or as a function of the entry (e.g. more for a disk-only entry). ``exclude``: ids of entries not to
    restore this time (the memory plan had no room to bring one in, or its restore failed): a shorter one may be.
    """
    ids = as_tokens(prompt)
    n = int(ids.shape[0])
    if n == 0:
        raise ValueError("empty prompt")

    # The live state.
    live_len, live_miss = 0, None
    if live_tokens is None or len(live_tokens) == 0:
        live_miss = "no live state"
    else:
        live = as_tokens(live_tokens)
        k = common_prefix_len(ids, live)
        if k == live.shape[0]:
            live_len = k
        elif k == n:
            live_miss = f"prompt ({n} tokens) is shorter than the live state ({live.shape[0]})"
        else:
            live_miss = f"live state diverges at token {k}"

    # The store.
    entry = next((e for e in store.prefixes_of(ids) if e.id not in exclude), None)
    store_miss = None
    if entry is None and exclude and any(e.id in exclude for e in store.prefixes_of(ids)):
        store_miss = "no memory to restore the stored prefix now (or its restore failed)"
    elif entry is None:
        if not len(store):
            store_miss = "no stored prefix"
        elif _any_extends(store.entries(), ids):
            store_miss = "stored prefixes all longer than prompt"
        else:
            store_miss = f"no stored prefix matches ({len(store)} stored)"
    else:
        cost = restore_cost_tokens(entry) if callable(restore_cost_tokens) else restore_cost_tokens
        worth = entry.n_tokens - cost
        if worth <= live_len:
            store_miss = (f"live state is as good ({live_len} tokens vs checkpoint {entry.n_tokens})" if live_len
                          else f"checkpoint of {entry.n_tokens} tokens saves less than it costs ({cost})")
            entry = None

    if entry is not None:
        action, start, restore_id = "restore", entry.n_tokens, entry.id
        if live_len:
            live_miss = f"a checkpoint saves more ({entry.n_tokens} tokens vs live {live_len})"
    elif live_len:
        action, start, restore_id = "reuse_live", live_len, None
        live_miss = None
    else:
        action, start, restore_id = "fresh", 0, None

    # Capture points.
    skipped: list[str] = []
    points: dict[int, tuple[str, str]] = {}   # position -> (candidate name, store kind)
    candidates: list[tuple[str, str, int | None]] = [("system", "system", hint_tokens),
                                                     ("turn", "common", turn_tokens)]
    if previous_fresh_prompt is not None and action != "reuse_live":
        candidates.append(("common", "common", common_prefix_len(ids, previous_fresh_prompt)))
    for name, kind, pos in candidates:
        if pos is None:
            continue
        why = _reject(pos, n, start, min_tokens, tail_guard)
        if why is None and name == "turn" and pos - start < min_tokens:
            # After a restore of the previous turn's prompt end, the turn start adds only the reply:
            # not worth a slot (it would push out other conversations' prompt-end captures).
            why = f"only {pos - start} tokens past the start {start}"
        if why is None and pos in points:
            why = f"same position as the {points[pos][0]} capture"
        if why is None and store.contains(ids[:pos]):
            why = "already stored"
        if why:
            skipped.append(f"{name} at {pos}: {why}")
        else:
            points[pos] = (name, kind)
    if turn_end_tokens is not None and 0 < turn_end_tokens < n:
        pos = turn_end_tokens
        why = (f"below minimum {min_tokens}" if pos < min_tokens else
               f"not after the start position {start}" if pos <= start else
               "already stored" if store.contains(ids[:pos]) else None)
        if why:
            skipped.append(f"prompt_end at {pos} (turn end): {why}")
        else:
            points.setdefault(pos, ("turn_end", "prompt_end"))
        capture_end = False      # the next turn will not share the last tokens: no prompt-end capture
    else:
        capture_end = n >= min_tokens and not store.contains(ids)
        if not capture_end:
            skipped.append(f"prompt_end at {n}: " + ("below minimum" if n < min_tokens else "already stored"))
    captures = tuple(CapturePoint(p, k) for p, (_, k) in sorted(points.items()))
    return PrefillPlan(action, start, n, restore_id, captures, capture_end, live_miss, store_miss, tuple(skipped))


def _any_extends(entries: list[Entry], ids: np.ndarray) -> bool:
    n = ids.shape[0]
    return any(e.n_tokens > n and np.array_equal(e.tokens[:n], ids) for e in entries)


def _reject(pos: int, n: int, start: int, min_tokens: int, tail_guard: int) -> str | None:
    if pos < min_tokens:
        return f"below minimum {min_tokens}"
    if pos >= n:
        return "not inside the prompt"
    if n - pos <= tail_guard:
        return f"within the last {tail_guard} tokens"
    if pos <= start:
        return f"not after the start position {start}"
    return None


def pieces(start: int, end: int, size: int, cuts: Sequence[int] = ()) -> Iterator[tuple[int, int]]:
    """Split [start, end) into (from, to) pieces of at most ``size`` tokens so that every cut in
    (start, end) is a piece boundary: the loop snapshots after the piece ending there.

    No other alignment is needed: the kernel's results do not depend on how a prompt is split
    into calls or chunks (bit-identical; tests/native/test_parity.py), so a prefill resumed from
    a restore or an abort computes exactly what a fresh one would.
    """
    if size <= 0:
        raise ValueError("size must be positive")
    if start > end:
        raise ValueError("start > end")
    stops = sorted({c for c in cuts if start < c < end})
    stops.append(end)
    pos = start
    for stop in stops:
        while pos < stop:
            nxt = min(pos + size, stop)
            yield pos, nxt
            pos = nxt
