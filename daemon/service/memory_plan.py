"""The memory plan: one pure policy for how this process's memory is split, computed once at start.

The daemon measures (daemon/service/memory_probe.py: MemAvailable and the cgroup limits) and passes the
numbers in; nothing here touches the system. The plan has these parts, in bytes:

    limit       the smallest room of: cgroup v2 memory.max, cgroup v1 memory.limit_in_bytes (our group
                and every ancestor, each minus what the group already holds that cannot be reclaimed)
                and MemAvailable; `limit_source` says which one
    dense       every weight that is not a routed expert (always resident)
    experts     routed experts: all of them, or the expert cache's budget when paged (--expert-cache)
    margin      kernel scratch, Python, the rest of the system: MARGIN_FRACTION of the room, >= MARGIN_MIN
    requests    per slot: the prompt's ids, a few logits rows and, with speculation, one verify's undo
                journal (StateCost.journal_bytes of 1 + the longest draft: ~1 MB a token at V4-Flash width,
                kept in the state until its next call) and its prompt-lookup table (actors/decoding/drafts.py,
                8 bytes a token); plus one all-logits block (prompt
                log-probabilities; kernel calls run one at a time, so one block at most)
    bodies      request bodies being read and parsed at once: the HTTP edge admits `body_bytes` of them
                at a time (daemon/api/app.py), counted BODY_PARSE_FACTOR times (the raw bytes and what
                JSON parsing makes of them); BODY_SHARE of what the weights and margin leave
    transients  a capture copies the state into a blob before the store takes it: one blob, at most the
                checkpoint budget (a larger capture is never taken, actors/engine/memory_guard.py)
    checkpoints the checkpoint memory budget (--checkpoint-memory-mb), blobs queued for the disk writer
                included; cut to CHECKPOINT_SHARE of what the weights and the margin leave
    replies     the reply table: finished replies' generated ids, replayed when a later prompt holds
                the reply again (daemon/protocol/reply_ids.py); REPLY_IDS_BYTES, cut to REPLY_SHARE of
                what the weights and the margin leave; the table keeps to it
    diagnostics finished responses' prompt ids, compared with later prompts (daemon/api/cache_diagnostics.py);
                DIAGNOSTIC_IDS_BYTES, cut to REPLY_SHARE like the replies
    states      the rest: the live states. Each slot's share is its state at min(context, STATE_PLAN_TOKENS)
                tokens; `slots` is how many shares fit (1..SLOTS_CAP) unless --slots says. A live state holds
                its window ring and compressor buffers at full size from its first token (resident_at);
                a checkpoint only the prefixes its tokens use (bytes_at). A restore from disk (read buffers
                and the rebuilt snapshot, up to twice its size) asks the guard for room in this pool first

A state grows with its tokens (StateCost.bytes_at: sliding windows, compressed rows, indexer keys, as
the kernel's State stores them). The plan is a budget, not a reservation: at each kernel call that grows
a state, the guard (actors/engine/memory_guard.py) checks live states + checkpoint memory against `pool`
(checkpoints + states), evicts checkpoints when a state needs their room and ends the request with a
memory error when even that is not enough — never the OOM killer.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence

MIB = 1 << 20
SLOTS_CAP = 4                 # what batched decode gains from on a few cores (more streams mostly add latency)
MARGIN_MIN = 64 * MIB
MARGIN_FRACTION = 0.05
STATE_PLAN_TOKENS = 32768     # a slot's share: its state at this many tokens (or the context, when shorter)
CHECKPOINT_SHARE = 0.25       # checkpoints take at most this share of what the weights and margin leave
PROMPT_BYTES_PER_TOKEN = 40   # a prompt as the Python tuple of ints a request carries (and its numpy copy)
LOGITS_ROWS = 4               # [V] float32 rows a request holds at once (last logits, shaped, log-probs)
BOOKKEEPING_PER_LAYER = 512  # a State's LayerState (vectors' headers, compressor fields) and its allocations
STATE_SLACK = 1.25            # a growing std::vector holds more than its size; measured RSS <= 1.0 x nbytes
# The reply table's bound: 4 bytes a generated id, ~4M ids (an agent's every reply of hundreds of turns,
# of several conversations); not worth a setting.
REPLY_IDS_BYTES = 16 * MIB
REPLY_SHARE = 0.01            # ...but at most this share of what the weights and margin leave (a small limit)
# The cache diagnostics' bound: 4 bytes a prompt id, ~2M ids (the last turns of a few long conversations:
# a comparison is with the previous turn).
DIAGNOSTIC_IDS_BYTES = 8 * MIB
# Request bodies read and parsed at once (the edge's byte semaphore): parsed (BODY_PARSE_FACTOR x their
# bytes) they take at most BODY_SHARE of what the weights and margin leave, their bytes within
# [BODY_MIN, BODY_MAX]. JSON parsing multiplies a body: measured (peak RSS, the raw body included) 5.6x
# for token-id arrays of 6-digit ids, 12.7x for compact arrays of 3-digit ids (`[300,301,...]`: a 32-byte
# int and an 8-byte slot for 4 bytes of text), 8.7x for ids below 256 (cached ints), 12.6x for many short
# messages, 3.8x for text (tests/unit/test_memory_plan.py). A body of nothing but empty containers
# reaches ~72x; it is bounded by the same semaphore, not by this factor.
BODY_SHARE = 0.05
BODY_MIN = 256 << 10          # a prompt of ~60k token ids or ~250 KB of text, under the smallest limits
BODY_MAX = 128 * MIB          # two of the largest accepted bodies (daemon/api/asgi.MAX_BODY, 64 MiB)
BODY_PARSE_FACTOR = 16

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
FORMS = ("auto (from the memory plan)", "all or 0 (every expert resident)",
         "a size in bytes or with a binary unit: 800M, 12G, 1.5T", "a share of the experts: 25%")


# --- --expert-cache ---------------------------------------------------------------------------------

class BudgetError(ValueError):
    """An expert-cache setting that cannot be read; the message names the allowed forms."""


@dataclass(frozen=True, slots=True)
class ExpertCacheSetting:
    """The parsed setting: mode "auto", "all", "bytes" (value: bytes) or "percent" (value: 1..100)."""
    mode: str
    value: float = 0


def parse_expert_cache(text: str) -> ExpertCacheSetting:
    """`--expert-cache` text -> setting. BudgetError says what is allowed."""
    t = str(text).strip().lower()
    if t == "auto":
        return ExpertCacheSetting("auto")
    if t in ("all", "0"):
        return ExpertCacheSetting("all")
    if t.endswith("%"):
        try:
            pct = float(t[:-1])
        except ValueError:
            pct = -1.0
        if not 0 < pct <= 100:
            raise BudgetError(f"{text!r}: a share must be more than 0% and at most 100%")
        return ExpertCacheSetting("all" if pct == 100 else "percent", pct)
    m = _SIZE.match(t)
    if m is None:
        raise BudgetError(f"{text!r} is not a size; allowed: {'; '.join(FORMS)}")
    size = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    return ExpertCacheSetting("all" if size == 0 else "bytes", size)


def check_expert_cache(text: str) -> str | None:
    """For config.Field: None when valid, else what is allowed."""
    try:
        parse_expert_cache(text)
    except BudgetError:
        return "; ".join(FORMS)
    return None


# --- weights --------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ModelBytes:
    """What the weights need in memory: routed experts (pageable) and the rest (always resident)."""
    dense: int
    experts: int


def split_weight_bytes(sizes, is_routed_expert=None) -> ModelBytes:
    """(canonical name, bytes) pairs -> dense and routed-expert bytes as stored. is_routed_expert: the
    model family's (daemon/weights/families.py); None: DeepSeek-V4's (`layers.L.ffn.experts.E.*`)."""
    if is_routed_expert is None:
        from cairn.daemon.weights.dsv4.names import is_routed_expert
    dense = experts = 0
    for name, n in sizes:
        if is_routed_expert(name):
            experts += int(n)
        else:
            dense += int(n)
    return ModelBytes(dense, experts)


# --- a live state's bytes -------------------------------------------------------------------------

def _comp_floats(rate: int, dim: int, overlap: bool, n: int) -> int:
    """Floats of one compressor's live state after n tokens (final rows + raw buffer + overlap)."""
    cw = 2 * dim if overlap else dim
    f = (n // rate) * dim + 2 * (n % rate) * cw
    if overlap and n >= rate:
        f += 2 * rate * dim
    return f


@functools.lru_cache(maxsize=16)
def _kind_counts(layer_types: tuple[str, ...]) -> tuple[int, int, int]:
    return (len(layer_types), layer_types.count("compressed_sparse_attention"),
            layer_types.count("heavily_compressed_attention"))


@dataclass(frozen=True, slots=True)
class StateCost:
    """DeepSeek-V4's (its WeightFamily.state_cost, daemon/weights/dsv4; another family brings its own
    with these methods). How a kernel State's bytes grow with its tokens (../shared/docs/v4-architecture.md §3):
    per layer a sliding window (W-1 rows), and per CSA / HCA layer compressed rows, indexer keys and
    the compressors' raw buffers; plus the token ids and the last logits a snapshot carries."""
    layer_types: tuple[str, ...]
    window: int
    head_dim: int
    index_head_dim: int
    csa_rate: int
    hca_rate: int
    vocab: int

    @classmethod
    def from_config(cls, config: Mapping, page_tokens: int = 0) -> "StateCost":
        """`page_tokens` 0: the kernel's default (the smallest multiple of every compress rate >= 256)."""
        csa, hca = int(config["csa_rate"]), int(config["hca_rate"])
        if page_tokens <= 0:
            step = math.lcm(max(1, csa), max(1, hca))
            page_tokens = -(-256 // step) * step
        return cls(tuple(config["layer_types"]), int(config["sliding_window"]), int(config["head_dim"]),
                   int(config["index_head_dim"]), csa, hca, int(config["vocab_size"]), int(page_tokens))

    page_tokens: int = 0     # tokens per page group of compressed rows (0: rows not rounded to groups)

    def _kinds(self) -> tuple[int, int, int]:
        """(layers, CSA layers, HCA layers): every per-layer sum below is a count times one layer's
        term (the same integers as a loop over the layers, without one: the decode path asks per token)."""
        return _kind_counts(self.layer_types)

    def bytes_at(self, n_tokens: int) -> int:
        """Bytes of a snapshot of a State holding n_tokens: the buffers' used prefixes (window rows,
        compressor slots; the kernel copies only those), its compressed rows, token ids and last
        logits — what Snapshot.nbytes reports, give or take its bookkeeping."""
        n = max(0, int(n_tokens))
        layers, csa, hca = self._kinds()
        floats = (layers * min(n, self.window - 1) * self.head_dim
                  + csa * (_comp_floats(self.csa_rate, self.head_dim, True, n)
                           + _comp_floats(self.csa_rate, self.index_head_dim, True, n))
                  + hca * _comp_floats(self.hca_rate, self.head_dim, False, n))
        return 4 * floats + 4 * n + 4 * self.vocab

    def snapshot_bytes_at(self, n_tokens: int) -> int:
        """What a checkpoint of n tokens holds in memory: bytes_at, its last page group whole, and the
        kernel's bookkeeping (a LayerState a layer, a pointer a group: BOOKKEEPING_PER_LAYER covers it)."""
        return self.bytes_at(n_tokens) + self.group_bytes() + BOOKKEEPING_PER_LAYER * len(self.layer_types)

    def _fixed_floats(self) -> int:
        """Floats of a live state's full-size buffers, whatever its tokens: every layer's window ring
        (W-1 rows) and each compressor's raw buffers (and CSA overlap) at full size."""
        def comp(rate: int, dim: int, overlap: bool) -> int:
            return 2 * rate * (2 * dim if overlap else dim) + (2 * rate * dim if overlap else 0)
        layers, csa, hca = self._kinds()
        return (layers * max(0, self.window - 1) * self.head_dim
                + csa * (comp(self.csa_rate, self.head_dim, True) + comp(self.csa_rate, self.index_head_dim, True))
                + hca * comp(self.hca_rate, self.head_dim, False))

    def group_bytes(self) -> int:
        """Bytes of one page group (0 when rows are not rounded to groups)."""
        if self.page_tokens <= 0:
            return 0
        _, csa, hca = self._kinds()
        return 4 * (csa * (self.page_tokens // self.csa_rate) * (self.head_dim + self.index_head_dim)
                    + hca * (self.page_tokens // self.hca_rate) * self.head_dim)

    def resident_at(self, n_tokens: int) -> int:
        """What a live state may hold in memory at n tokens: its bytes and the vectors' spare capacity,
        the full-size buffers a live state keeps however few tokens it holds (the window ring: ~23 MB at
        V4-Flash width), and its last page group allocated whole."""
        n = max(0, int(n_tokens))
        unused = 4 * max(0, self._fixed_floats() - self._buffer_floats(n))   # full-size buffers past the prefixes
        return (int(self.bytes_at(n) * STATE_SLACK) + unused + self.group_bytes()
                + BOOKKEEPING_PER_LAYER * len(self.layer_types))

    def _buffer_floats(self, n: int) -> int:
        """Floats of the used prefixes of the windows and compressor buffers at n tokens."""
        layers, csa, hca = self._kinds()
        return (layers * min(n, self.window - 1) * self.head_dim
                + csa * (_comp_floats(self.csa_rate, self.head_dim, True, n) - (n // self.csa_rate) * self.head_dim
                         + _comp_floats(self.csa_rate, self.index_head_dim, True, n)
                         - (n // self.csa_rate) * self.index_head_dim)
                + hca * (_comp_floats(self.hca_rate, self.head_dim, False, n) - (n // self.hca_rate) * self.head_dim))

    def journal_bytes(self, n_tokens: int) -> int:
        """Bytes of the undo record a verify of n_tokens keeps in its state until the state's next call
        (the kernel's journal_bytes, Model.verify_journal_nbytes): per token and layer its window row and
        each compressor's two buffer slots, per compressor window it completes a row (and for CSA the
        overlap), the logits after each token and before the call; plus the records' bookkeeping."""
        s = max(0, int(n_tokens))
        if s == 0:
            return 0
        writes = floats = appends = 0

        def comp(rate: int, cw: int, dim: int, overlap: bool) -> None:
            nonlocal writes, floats, appends
            windows = -(-s // rate)
            writes += 2 * s + (2 * windows if overlap else 0)
            floats += 2 * s * cw + (2 * windows * rate * dim if overlap else 0)
            appends += windows
        for kind in self.layer_types:
            writes += s
            floats += s * self.head_dim
            if kind == "heavily_compressed_attention":
                comp(self.hca_rate, self.head_dim, self.head_dim, False)
            elif kind == "compressed_sparse_attention":
                comp(self.csa_rate, 2 * self.head_dim, self.head_dim, True)
                comp(self.csa_rate, 2 * self.index_head_dim, self.index_head_dim, True)
        # sizeof(Write) = 32, an append record 16, the Journal itself < 256
        return 256 + 32 * writes + 4 * floats + 16 * appends + 4 * (s + 1) * self.vocab

    @property
    def per_token(self) -> int:
        """Bytes a token adds once the windows are full (averaged over the compression rates)."""
        far = 1 << 20
        return round((self.bytes_at(2 * far) - self.bytes_at(far)) / far)


def state_bytes(config: Mapping, n_tokens: int) -> int:
    """Bytes of a kernel State holding n_tokens (StateCost.bytes_at of the resolved model config)."""
    return StateCost.from_config(config).bytes_at(n_tokens)


def plan_state_tokens(context_length: int) -> int:
    return max(1, min(int(context_length), STATE_PLAN_TOKENS))


# --- the limit --------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class LimitSource:
    """One candidate limit: a cgroup's (limit, and what the group already holds that cannot be
    reclaimed) or MemAvailable (limit = room, used 0)."""
    kind: str              # "cgroup v2 memory.max" | "cgroup v1 memory.limit_in_bytes" | "MemAvailable"
    limit: int
    used: int = 0
    path: str = ""         # the cgroup whose limit this is ("" for MemAvailable)

    @property
    def room(self) -> int:
        return max(0, self.limit - self.used)

    def describe(self) -> str:
        if self.kind == "MemAvailable":
            return f"MemAvailable {_size(self.limit)}"
        return f"{self.kind} of {self.path or '/'} {_size(self.limit)} - {_size(self.used)} in use"


def pick_limit(sources: Sequence[LimitSource]) -> LimitSource | None:
    """The binding limit: the smallest room (ties to the first given). None: nothing known."""
    best = None
    for s in sources:
        if best is None or s.room < best.room:
            best = s
    return best


def available_memory(meminfo: str) -> int | None:
    """MemAvailable from the text of /proc/meminfo, in bytes (None when absent)."""
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            try:
                return int(parts[1]) * 1024
            except (IndexError, ValueError):
                return None
    return None


# --- the plan ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Each part's bytes, the slot count, the expert budget, the limit and where it came from."""
    limit_bytes: int | None         # the binding limit as set (None: unknown, the guard is off)
    room_bytes: int | None          # what this process may fill: the limit minus what it held at start
    limit_source: str               # which limit binds, e.g. "cgroup v1 memory.limit_in_bytes of /x 300.0 MiB …"
    dense_bytes: int
    expert_bytes: int               # routed experts in memory: all of them, or the cache budget when paged
    expert_cache_bytes: int         # the kernel's budget: 0 = every expert resident (no paging)
    margin_bytes: int
    request_bytes: int
    transient_bytes: int            # the largest snapshot copy a capture may make (see memory_guard)
    checkpoint_bytes: int           # the checkpoint store's memory budget (queued blobs included)
    state_bytes: int                # what the live states may use: slots x share, and all that is left
    state_share_bytes: int          # one slot's share (its state at share_tokens, resident)
    share_tokens: int
    per_token_bytes: int            # a state's growth per token (StateCost.per_token)
    slots: int
    slots_reason: str
    reason: str                     # one line: the sum, and what was decided
    expert_reason: str = ""         # the expert part of it (status shows it with the expert cache)
    state_cost: StateCost | None = field(default=None, compare=False)
    reply_bytes: int = 0            # the reply table's bound (reply_ids.ReplyTable)
    diagnostic_bytes: int = 0       # the cache diagnostics' bound (cache_diagnostics.FingerprintTable)
    body_bytes: int = BODY_MAX      # request bodies read / parsed at once (the edge's byte semaphore)
    journal_bytes: int = 0          # per slot: one verify's undo journal (0: speculation off)

    @property
    def paged(self) -> bool:
        return self.expert_cache_bytes > 0

    @property
    def bodies_bytes(self) -> int:
        """What request bodies being read and parsed may hold (0 with no limit known: not planned)."""
        return 0 if self.room_bytes is None else self.body_bytes * BODY_PARSE_FACTOR

    @property
    def pool_bytes(self) -> int | None:
        """What live states and checkpoint memory may hold together (the guard's budget)."""
        return None if self.room_bytes is None else self.state_bytes + self.checkpoint_bytes

    def as_status(self) -> dict:
        """For /v1/status: plain numbers and the reason."""
        return {"limit_bytes": self.limit_bytes, "room_bytes": self.room_bytes, "limit_source": self.limit_source,
                "parts": {"dense": self.dense_bytes, "experts": self.expert_bytes, "margin": self.margin_bytes,
                          "requests": self.request_bytes, "transients": self.transient_bytes,
                          "checkpoints": self.checkpoint_bytes, "replies": self.reply_bytes,
                          "diagnostics": self.diagnostic_bytes, "bodies": self.bodies_bytes,
                          "states": self.state_bytes},
                "body_bytes": self.body_bytes, "journal_bytes": self.journal_bytes,
                "slots": self.slots, "state_share_bytes": self.state_share_bytes, "share_tokens": self.share_tokens,
                "per_token_bytes": self.per_token_bytes, "expert_cache_bytes": self.expert_cache_bytes,
                "paged": self.paged, "reason": self.reason}


def margin_bytes(room: int) -> int:
    return max(MARGIN_MIN, int(room * MARGIN_FRACTION))


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    if abs(n) < (1 << 30):
        return f"{n / MIB:.1f} MiB"
    return f"{n / (1 << 30):.2f} GiB"


def plan_memory(*, limit: LimitSource | None, weights: ModelBytes, state: StateCost | None, context_length: int,
                expert_setting: ExpertCacheSetting = ExpertCacheSetting("auto"), slots_setting: int | None = None,
                checkpoint_setting: int = 0, logits_block_bytes: int = 0,
                min_expert_budget: int = 0, reply_bytes: int = 0, diagnostic_bytes: int = 0,
                journal_bytes: int = 0, lookup_bytes_per_token: int = 0) -> MemoryPlan:
    """The plan (see the module notes). `checkpoint_setting`: the configured checkpoint budget in
    bytes (0: checkpoints off); `logits_block_bytes`: one all-logits prefill block; `min_expert_budget`:
    the kernel's least expert budget (an explicit smaller size is passed on; its error names it);
    `reply_bytes`: the reply table's bound; `diagnostic_bytes`: the cache diagnostics' bound;
    `journal_bytes`: one verify's undo journal, per slot (0: speculation off); `lookup_bytes_per_token`:
    the prompt-lookup table's bytes a token (actors/decoding/drafts.py; 0: speculation off)."""
    share_tokens = plan_state_tokens(context_length)
    share = state.resident_at(share_tokens) if state is not None else 0
    per_token = state.per_token if state is not None else 0
    vocab = state.vocab if state is not None else 0
    per_request = (share_tokens * (PROMPT_BYTES_PER_TOKEN + max(0, int(lookup_bytes_per_token)))
                   + LOGITS_ROWS * 4 * vocab + max(0, int(journal_bytes)))
    share_blob = state.snapshot_bytes_at(share_tokens) if state is not None else 0
    room = limit.room if limit is not None else None
    where = limit.describe() if limit is not None else "no limit known"
    experts = weights.experts

    # The expert budget first: an explicit one as given, `auto` by what the limit leaves.
    mode = expert_setting.mode
    budget = 0                       # the kernel's: 0 = all resident
    expert_note = ""
    if mode == "bytes":
        budget = int(expert_setting.value)
        if budget >= experts:
            budget, expert_note = 0, f"expert_cache {_size(int(expert_setting.value))} holds every routed expert"
        else:
            expert_note = f"experts paged: {_size(budget)} of {_size(experts)} (expert_cache setting)"
    elif mode == "percent":
        budget = int(experts * expert_setting.value / 100)
        expert_note = (f"experts paged: {expert_setting.value:g}% of {_size(experts)} = {_size(budget)} "
                       "(expert_cache setting)")
    elif mode == "all":
        expert_note = "every routed expert resident (expert_cache setting)"

    if room is None:
        ckpt = checkpoint_setting
        slots = slots_setting or 1
        why = "memory limit unknown: one slot" if slots_setting is None else "set by the slots setting"
        ex = budget if budget else experts
        return MemoryPlan(None, None, where, weights.dense, ex, budget, 0, 0, 0, ckpt, 0, share, share_tokens,
                          per_token, slots, why,
                          f"no memory limit known (no MemAvailable, no cgroup limit): {why}; "
                          f"{expert_note or 'every routed expert resident'}; no memory guard",
                          expert_note or "every routed expert resident", state, reply_bytes, diagnostic_bytes,
                          BODY_MAX, max(0, int(journal_bytes)))

    margin = margin_bytes(room)
    left = room - weights.dense - margin
    ckpt = min(checkpoint_setting, max(0, int(left * CHECKPOINT_SHARE)))
    ckpt_note = "" if ckpt == checkpoint_setting else f" (cut from {_size(checkpoint_setting)} to fit)"
    reply_bytes = min(reply_bytes, max(0, int(left * REPLY_SHARE)))
    diagnostic_bytes = min(diagnostic_bytes, max(0, int(left * REPLY_SHARE)))
    transient = min(share_blob, ckpt)
    body_bytes = min(BODY_MAX, max(BODY_MIN, int(max(0, left) * BODY_SHARE) // BODY_PARSE_FACTOR))
    bodies = body_bytes * BODY_PARSE_FACTOR
    fixed = (weights.dense + margin + ckpt + transient + logits_block_bytes + reply_bytes + diagnostic_bytes
             + bodies)
    n_first = slots_setting or 1
    if mode == "auto":
        if room - fixed - experts >= n_first * (share + per_request) or experts <= 0:
            expert_note = "every routed expert resident"
        else:
            budget = room - fixed - n_first * (share + per_request)
            if budget <= 0:
                budget = 0
                expert_note = "every routed expert resident: paging them would not make room for a state's share"
            elif budget < min_expert_budget:
                expert_note = (f"every routed expert resident: paging would leave the experts {_size(budget)}, less "
                               f"than the kernel's least budget {_size(min_expert_budget)}; lower "
                               "checkpoint_memory_mb or set expert_cache")
                budget = 0
            else:
                expert_note = f"experts paged: {_size(budget)} of {_size(experts)} ({100 * budget / experts:.0f}%)"
    in_memory_experts = budget if budget else experts

    after = room - fixed - in_memory_experts       # for the live states and their requests
    if slots_setting is not None:
        slots, slots_why = slots_setting, "set by the slots setting"
    elif budget:
        slots, slots_why = 1, "experts paged: one slot, a further state would come out of the expert cache"
    elif share <= 0:
        slots, slots_why = 1, "state size unknown: one slot"
    else:
        fit = max(0, after) // (share + per_request)
        slots = max(1, min(SLOTS_CAP, int(fit)))
        slots_why = (f"{_size(max(0, after))} for states holds {fit} share(s) of {_size(share)} "
                     f"({share_tokens} tokens); 1..{SLOTS_CAP}")
    requests = slots * per_request + logits_block_bytes
    short = slots * per_request - after           # > 0: the fixed parts and the requests pass the room
    if short > 0 and ckpt > 0:
        # The guard's pool (states + checkpoints) must be memory that is there: the checkpoint budget (a
        # cache) gives way first, and the capture copy bounded by it with it.
        cut_to = max(0, ckpt - short)
        short -= (ckpt - cut_to) + (transient - min(share_blob, cut_to))
        ckpt_note = f" (cut from {_size(checkpoint_setting)} to fit the fixed parts)"
        ckpt, transient = cut_to, min(share_blob, cut_to)
    states = max(0, -short)
    reason = (f"limit {where} = {_size(room)}: dense {_size(weights.dense)} + experts {_size(in_memory_experts)} + "
              f"margin {_size(margin)} + requests {_size(requests)} + transients {_size(transient)} + checkpoints "
              f"{_size(ckpt)}{ckpt_note} + replies {_size(reply_bytes)} + diagnostics {_size(diagnostic_bytes)} + "
              f"bodies {_size(bodies)} + states {_size(states)}; {slots} slot(s) ({slots_why}); {expert_note}")
    if short > 0:
        reason += (f"; the fixed parts pass the room by {_size(short)} even without checkpoints: nothing is left "
                   "for live states, every request will end with a memory error; raise the limit or set fewer slots")
    elif states + ckpt <= 0:
        reason += "; nothing is left for live states: every request will end with a memory error, raise the limit"
    elif states < share:
        reason += f"; a state may reach {max(0, states + ckpt) // max(1, int(per_token * STATE_SLACK))} tokens"
    return MemoryPlan(limit.limit, room, where, weights.dense, in_memory_experts, budget, margin, requests, transient, ckpt,
                      states, share, share_tokens, per_token, slots, slots_why, reason, expert_note, state,
                      reply_bytes, diagnostic_bytes, body_bytes, max(0, int(journal_bytes)))
