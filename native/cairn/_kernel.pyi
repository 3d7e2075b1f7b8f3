"""cairn._kernel: DeepSeek-V4 forward pass (fp32, CPU), state snapshots, chunked prefill."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

MAX_CHUNK: int
SNAPSHOT_VERSION: int

class KernelError(ValueError):
    """Bad input to the kernel (tokens, chunk, snapshot blob); a ValueError."""

class StateBusyError(RuntimeError):
    """A State is held by a kernel call (prefill, decode, decode_batch, verify, rewind, snapshot):
    a second call on it, or any of its getters, raises this until the call ends."""

class AbortFlag:
    """Thread-safe flag; prefill checks it between chunks."""
    def __init__(self) -> None: ...
    def set(self) -> None: ...
    def clear(self) -> None: ...
    def is_set(self) -> bool: ...

class Model:
    """Immutable config + weights. Every weight matrix is packed at load into panels: BF16 ones
    as BF16 panels widened inside the product (half the memory and bandwidth, identical results;
    widen_bf16=True stores fp32 panels instead), F16/F32 ones as fp32 panels, quantized ones
    (F8_E4M3 [out, in] or FP4 pairs I8 [out, in/2], each with its F8_E8M0 scale 'X.scale') as
    panels of the stored codes, widened and scaled inside the product (the bits of fp32 panels of
    the dequantized weights). Sources of packed matrices are released after packing; other F32
    tensors and a BF16 embedding are used in place (kept alive by the Model). threads=0: all
    cores. batched_indexer=False scores the CSA indexer with the scalar per-query reference loop
    (identical results).

    expert_cache_bytes > 0 (and below every routed expert's bytes): routed experts are paged from
    the packed_cache file (required; written by a streaming pack when missing) into
    expert_cache_bytes // slot_bytes slots, read on demand (O_DIRECT, else buffered reads dropped
    from the page cache; CAIRN_EXPERT_DIRECT_IO=0 forces the latter) and never mapped; the dense
    part stays resident. expert_policy: 'hotpin' (LRU plus a pinned set of the most frequent
    experts, with hysteresis), 'lrfu' (decayed counts) or 'lru'. expert_readers (1..16, default
    4): reader threads, i.e. expert reads in flight. Outputs are bit-identical to the resident
    model. A budget below num_experts_per_tok slots raises ValueError naming the minimum."""
    def __init__(
        self,
        config: dict,
        weights: dict[str, tuple[np.ndarray, str]],
        fingerprint: str,
        threads: int = 0,
        *,
        batched_indexer: bool = True,
        widen_bf16: bool = False,
        packed_cache: str = "",
        expert_cache_bytes: int = 0,
        expert_policy: str = "hotpin",
        expert_readers: int = 4,
        page_tokens: int = 0,
    ) -> None: ...
    def expert_cache_info(self) -> dict[str, int | bool]:
        """budget_bytes (0: every expert resident), slot_bytes, slots, expert_bytes_total,
        dense_bytes, experts_total, pinned, direct_io, readers (0 when resident), paging."""
    def expert_cache_stats(self) -> dict[str, int | float]:
        """Cumulative: hits, misses, bytes_read (= misses * slot_bytes), read_seconds (sum over
        reads), stall_seconds (compute waiting for reads), read_busy_seconds (wall time with at least
        one read in flight), evictions. All 0 when resident."""
    def set_route_trace(self, on: bool) -> None:
        """Record each MoE call's distinct experts."""
    def take_route_trace(self) -> npt.NDArray[np.int32]:
        """Recorded rows (call_seq, layer, expert), int32 [n, 3]; clears them. call_seq counts
        every MoE call of the model (recording or not)."""
    @property
    def packed_from_cache(self) -> bool:
        """The panels were mapped from the packed cache file instead of packed."""
    @property
    def packed_cache_written(self) -> bool: ...
    @property
    def packed_bytes(self) -> int: ...
    @property
    def packed_layout_key(self) -> int:
        """The packed cache file header's layout key for these panels (packed_layout_key(), then
        every matrix's format, shape and offset): a file with another key is re-packed."""
    @property
    def fingerprint(self) -> str: ...
    @property
    def family(self) -> str:
        """'deepseek_v4', or 'qwen3_5' when the config's model_type (top level or text_config) is
        qwen3_5* (then the weights are Qwen35Model's and only page_tokens applies; its default: 64)."""
    @property
    def supports_verify(self) -> bool:
        """Whether verify/verify_batch/rewind work on its states; False (qwen3_5): they and
        verify_journal_nbytes raise ValueError('speculative decoding is off for qwen3_5: ...')."""
    @property
    def vocab_size(self) -> int: ...
    @property
    def n_layers(self) -> int: ...
    @property
    def threads(self) -> int: ...
    @property
    def widen_bf16(self) -> bool: ...
    batched_indexer: bool
    @property
    def page_tokens(self) -> int:
        """Tokens per page group of a state's compressed rows (Model(page_tokens=...); 0 picks 256,
        rounded up to a multiple of every compress rate)."""
    @property
    def page_nbytes(self) -> int: ...
    def verify_journal_nbytes(self, n_tokens: int) -> int:
        """Bytes of the undo record a verify of n_tokens (1..MAX_CHUNK) tokens keeps in its state
        until the state's next call: each token's window row and compressor buffer slots, the CSA
        overlaps and appended rows of each window it completes, and n_tokens + 1 rows of logits.
        An exact upper bound (the record is reserved at this size); about 1 MB per token at
        V4-Flash width, half of it logits."""

class Qwen35Model:
    """Immutable Qwen3.5 text model (qwen3_5 dense or qwen3_5_moe), fp32: forward() runs a whole sequence
    from an empty state; .model is the same model as a Model (State, prefill, decode, snapshots).

    config: HF's config dict (a nested 'text_config' is used when present; layer_types or
    full_attention_interval). weights: canonical name -> float32 array (or (array, "F32")): HF's names
    without 'model.' / 'model.language_model.'; experts per expert or fused 3-D
    ('layers.L.mlp.experts.gate_up_proj' [E, 2I, D], '.down_proj' [E, D, I]); lm_head.weight unless tied.
    A missing or misshapen tensor raises ValueError naming it and the expected shape. threads=0: all cores."""
    def __init__(self, config: dict, weights: dict[str, np.ndarray | tuple[np.ndarray, str]],
                 threads: int = 0) -> None: ...
    def forward(self, ids: npt.NDArray[np.int32], *, chunk: int = 0) -> npt.NDArray[np.float32]:
        """Logits [S, V] of every position of ids [S]. chunk > 0 feeds calls of that many tokens,
        carrying the per-token state between them: the same bits as one call. Runs without the GIL."""
    @property
    def model(self) -> Model: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def n_layers(self) -> int: ...
    @property
    def threads(self) -> int: ...
    @property
    def is_moe(self) -> bool: ...
    @property
    def layer_types(self) -> list[str]:
        """'linear_attention' (Gated DeltaNet) or 'full_attention' per layer."""

class Snapshot:
    """Immutable snapshot of a State: a copy of the used part of its tail (window ring rows,
    compressor buffer slots and overlaps, tokens, logits) and references to its page groups of
    compressed rows, shared with the state and with other snapshots (native/include/cairn/pages.h)."""
    @property
    def n_tokens(self) -> int: ...
    @property
    def tokens(self) -> npt.NDArray[np.int32]: ...
    @property
    def page_ids(self) -> npt.NDArray[np.uint64]:
        """Ids of every page group it holds (the last may be partial), in token order."""
    @property
    def page_nbytes(self) -> int: ...
    @property
    def page_tokens(self) -> int: ...
    @property
    def n_full_pages(self) -> int:
        """n_tokens // page_tokens: the groups stored as pages on disk (0 for a model without
        compressed layers, which has no groups)."""
    @property
    def own_nbytes(self) -> int:
        """Bytes it holds outside page groups, as allocated (the used part of the tail): what the
        State's tail_nbytes said before it was taken."""
    @property
    def copied_nbytes(self) -> int:
        """Bytes copied when it was taken (0 for one rebuilt from parts)."""
    @property
    def nbytes(self) -> int:
        """own_nbytes plus every page group it references, shared or not."""
    def tail(self) -> bytes:
        """Versioned, checksummed blob of everything but the full page groups."""
    def page(self, k: int) -> npt.NDArray[np.uint8]:
        """Full page group k's bytes: a read-only view of the group (no copy)."""
    def to_bytes(self) -> bytes:
        """Tail, full groups and a checksum of the groups: one self-contained blob."""
    @staticmethod
    def from_parts(model: Model, tail: bytes | bytearray | memoryview,
                   pages: Sequence[bytes | bytearray | memoryview | npt.NDArray[np.uint8]]) -> Snapshot:
        """Rebuild from a tail and its full page groups, in order; KernelError on any mismatch."""
    @staticmethod
    def from_bytes(model: Model, blob: bytes | bytearray | memoryview) -> Snapshot: ...

def page_pool() -> dict[str, int]:
    """{'groups', 'bytes'}: page groups alive in this process (states and snapshots share them)."""

class State:
    """Mutable per-sequence state. Single writer: a concurrent second call raises StateBusyError.
    Every getter but page_nbytes reads the state's mutable data, and raises StateBusyError while a
    kernel call holds the state (read figures published when a call ends instead); each claims the
    state for its read, so a call started meanwhile raises StateBusyError too."""
    def __init__(self, model: Model) -> None: ...
    @property
    def n_tokens(self) -> int: ...
    @property
    def rewindable(self) -> int:
        """Tokens rewind can take back: those its last call, a verify, fed (0 otherwise)."""
    @property
    def journal_nbytes(self) -> int:
        """Bytes its undo record holds (after a verify, until the next call; 0 otherwise), at most
        Model.verify_journal_nbytes of that verify's tokens."""
    @property
    def tokens(self) -> npt.NDArray[np.int32]: ...
    @property
    def nbytes(self) -> int:
        """Bytes of state payload (windows, compressed rows, buffers, overlaps)."""
    @property
    def last_logits(self) -> npt.NDArray[np.float32] | None: ...
    @property
    def page_ids(self) -> npt.NDArray[np.uint64]: ...
    @property
    def page_nbytes(self) -> int: ...
    @property
    def tail_nbytes(self) -> int:
        """Bytes a snapshot of it would copy and hold outside page groups (its own_nbytes)."""
    def snapshot(self, *, share_pages: bool = True) -> Snapshot:
        """Tail copied, page groups shared (the state copies a shared group before writing it);
        share_pages=False copies every group too."""
    @staticmethod
    def restore(model: Model, snapshot: Snapshot) -> State: ...

def prefill(
    state: State,
    tokens: npt.NDArray[np.int32],
    *,
    chunk: int = 128,
    abort: AbortFlag | None = None,
    all_logits: bool = False,
) -> tuple[int, npt.NDArray[np.float32]]: ...
def decode(state: State, token: int) -> npt.NDArray[np.float32]: ...
def verify(state: State, tokens: npt.NDArray[np.int32]) -> npt.NDArray[np.float32]:
    """Feed 1..MAX_CHUNK tokens in one speculative call; logits [S, V], the bits of decoding them
    one by one. Keeps an undo record (Model.verify_journal_nbytes) until the state's next call."""
def verify_batch(states: Sequence[State], tokens: Sequence[npt.NDArray[np.int32]]) -> list[npt.NDArray[np.float32]]:
    """verify for distinct states of one model in one call; one [len(tokens[b]), V] array each."""
def rewind(state: State, k: int) -> None:
    """Take back the last k tokens its last call, a verify, fed (KernelError otherwise)."""
def decode_batch(
    states: Sequence[State],
    tokens: Sequence[int] | npt.NDArray[np.integer],
    *,
    abort: AbortFlag | None = None,
) -> npt.NDArray[np.float32]:
    """One decode step for distinct states of one model (tokens[b] to states[b]); logits [B, V],
    bit-identical to decode() of each alone. Preset abort: nothing runs, 0 rows."""

def replay_expert_policy(
    keys: npt.NDArray[np.int64], steps: npt.NDArray[np.int64], slots: int, policy: str = "hotpin",
    *, k: int = 1,
) -> dict[str, int]:
    """The kernel's expert slot policy ('lru' | 'lrfu' | 'hotpin') replayed on keys (layer * E +
    expert, in access order) with steps (each key's MoE call, non-decreasing), as moe_block
    acquires them in a model with `slots` slots and num_experts_per_tok = k (a call that finds no
    slot releases its oldest held one and retries): dict(hits, misses, evictions, releases), releases
    = how many times that happened."""

def packed_layout() -> dict[str, str]:
    """The packed cache file's layout description (field -> value, in hashing order)."""

def packed_layout_key(overrides: dict[str, str] = ...) -> int:
    """Key of the layout description, some fields' values replaced: what a build whose layout
    differs in them would compute. ValueError for a field that does not exist."""

# benchmark / test hooks (not API)
def _packed_matmul(
    x: npt.NDArray[np.float32], w: npt.NDArray[np.float32], threads: int = 1, reps: int = 1
) -> tuple[npt.NDArray[np.float32], float]: ...
def _ggml_matmul(
    x: npt.NDArray[np.float32], blocks: npt.NDArray[np.uint8], type: str, threads: int = 1, reps: int = 1
) -> tuple[npt.NDArray[np.float32], float]: ...
def _profile(reset: bool = True) -> dict[str, float]: ...
def _fail_worker_step(skip: int | None = None) -> int: ...
def _fma_peak(threads: int = 1, seconds: float = 0.5) -> float: ...
