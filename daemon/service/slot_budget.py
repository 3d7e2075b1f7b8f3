"""Pure default for `--slots`: how many live states fit in the machine's memory.

A slot's live state grows with its tokens (sliding window, compressed rows, indexer keys), so the
budget is per slot at the model's full context length: a slot may be filled to it. The rule:

    usable   = available memory (after the weights are loaded) - checkpoint memory budget
    slots    = usable // (2 * state bytes at full context), clamped to 1..SLOTS_CAP

The factor 2 leaves half of the remainder for everything else (the page cache holding the weights,
prefill scratch, the rest of the system). SLOTS_CAP (4) is what batched decode gains from on a few
cores: decode is bandwidth-bound and more streams mostly add latency per stream. When memory or the
state size is unknown, 1 (one request at a time, the seed's behaviour). An explicit `--slots` wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

SLOTS_CAP = 4
HEADROOM = 2          # per-slot bytes are doubled: half the remainder stays free


@dataclass(frozen=True, slots=True)
class SlotsDefault:
    slots: int
    reason: str


def _comp_floats(rate: int, dim: int, overlap: bool, n: int) -> int:
    """Floats of one compressor's live state after n tokens (final rows + raw buffer + overlap)."""
    cw = 2 * dim if overlap else dim
    f = (n // rate) * dim + 2 * (n % rate) * cw
    if overlap and n >= rate:
        f += 2 * rate * dim
    return f


def state_bytes(config: Mapping, n_tokens: int) -> int:
    """Bytes of a kernel State holding n_tokens (the payload State.nbytes reports, plus the token ids
    and the last logits). `config` is the resolved model config the kernel reads."""
    W, Dh, Di = int(config["sliding_window"]), int(config["head_dim"]), int(config["index_head_dim"])
    csa, hca = int(config["csa_rate"]), int(config["hca_rate"])
    floats = 0
    for kind in config["layer_types"]:
        floats += min(n_tokens, W - 1) * Dh
        if kind == "compressed_sparse_attention":
            floats += _comp_floats(csa, Dh, True, n_tokens) + _comp_floats(csa, Di, True, n_tokens)
        elif kind == "heavily_compressed_attention":
            floats += _comp_floats(hca, Dh, False, n_tokens)
    return 4 * floats + 4 * n_tokens + 4 * int(config["vocab_size"])


def default_slots(available_bytes: int | None, per_slot_bytes: int | None, reserved_bytes: int = 0,
                  cap: int = SLOTS_CAP) -> SlotsDefault:
    """The default number of slots, and why (logged at start)."""
    if not available_bytes or not per_slot_bytes or per_slot_bytes <= 0:
        return SlotsDefault(1, "memory or state size unknown: one slot")
    usable = available_bytes - reserved_bytes
    fit = max(0, usable) // (HEADROOM * per_slot_bytes)
    slots = max(1, min(cap, int(fit)))
    mib = 1 << 20
    why = (f"{available_bytes // mib} MiB available - {reserved_bytes // mib} MiB checkpoint budget = "
           f"{max(0, usable) // mib} MiB; {per_slot_bytes // mib} MiB state per slot at full context "
           f"(x{HEADROOM} headroom) fits {fit}; capped to 1..{cap}")
    return SlotsDefault(slots, why)


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
