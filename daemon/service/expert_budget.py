"""Pure sizing of the routed-expert cache (`--expert-cache`) and the default `--slots`: one policy
for how the machine's memory is split between weights, live states, checkpoints and paged experts.

The daemon reads the numbers (daemon/service/memory_probe.py) and passes them in; nothing here touches the
system. The split, in this order:

    avail    = min(MemAvailable, the cgroup's limit - its unreclaimable usage)   measured before the load
    dense    = every weight that is not a routed expert (always resident)
    reserved = dense + checkpoint memory budget + slots x state at STATE_PLAN_TOKENS + margin
    experts  = all resident when avail - reserved holds them all ("all"), else avail - reserved

The margin (MARGIN_FRACTION of avail, at least MARGIN_MIN) is for everything else: the kernel's
scratch, Python, the prefill's logits, the rest of the system. A live state is reserved at
STATE_PLAN_TOKENS (or the context length when shorter), not at the model's full context: the
expert budget is fixed at start while a state only grows as far as its conversation goes, and a
1M-token V4 state alone would leave nothing for the experts. When the experts do not all fit,
the default is one slot: each further slot's state would come out of the expert cache.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


MIB = 1 << 20
MARGIN_MIN = 512 * MIB
MARGIN_FRACTION = 0.05
STATE_PLAN_TOKENS = 32768

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
FORMS = ("auto (from the machine's memory)", "all or 0 (every expert resident)",
         "a size in bytes or with a binary unit: 800M, 12G, 1.5T", "a share of the experts: 25%")


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


@dataclass(frozen=True, slots=True)
class ModelBytes:
    """What the weights need in memory: routed experts (pageable) and the rest (always resident)."""
    dense: int
    experts: int


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    expert_cache_bytes: int     # 0: every expert resident (the kernel's "no paging")
    slots: int | None           # None: the caller keeps its own rule (everything resident, slots unset)
    reason: str                 # logged at start and shown in /v1/status

    @property
    def paged(self) -> bool:
        return self.expert_cache_bytes > 0


def margin_bytes(avail: int) -> int:
    return max(MARGIN_MIN, int(avail * MARGIN_FRACTION))


def _gib(n: int) -> str:
    if abs(n) < (1 << 30):
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / (1 << 30):.2f} GiB"


def plan_memory(setting: ExpertCacheSetting, model: ModelBytes, *, avail: int | None,
                state_bytes: int | None, checkpoint_bytes: int, slots_setting: int | None,
                avail_source: str = "MemAvailable", min_budget: int = 0) -> MemoryPlan:
    """The expert-cache budget (bytes; 0 = all resident) and, when paging, the slot count.

    `state_bytes`: one live state at min(STATE_PLAN_TOKENS, context) tokens (None: unknown, 0 is
    reserved); `avail`: None when unknown (then only an explicit size pages); `min_budget`: the
    kernel's least budget (num_experts_per_tok experts), estimated from the config. An explicit size
    below it is passed on (the kernel's error names the minimum); `auto` never asks for less: with
    less room than that it keeps every expert resident, as before paging existed, and says why."""
    if setting.mode == "all":
        return MemoryPlan(0, None, "set by the expert_cache setting: every routed expert resident")
    if setting.mode == "bytes":
        budget = int(setting.value)
        if budget >= model.experts:
            return MemoryPlan(0, None, f"expert_cache setting {_gib(budget)} holds every routed expert "
                                       f"({_gib(model.experts)}): all resident")
        return MemoryPlan(budget, slots_setting or 1, f"set by the expert_cache setting: {_gib(budget)} of "
                                                      f"{_gib(model.experts)} routed experts")
    if setting.mode == "percent":
        budget = int(model.experts * setting.value / 100)
        return MemoryPlan(budget, slots_setting or 1, f"set by the expert_cache setting: {setting.value:g}% of "
                                                      f"{_gib(model.experts)} routed experts = {_gib(budget)}")
    if not avail or model.experts <= 0:
        return MemoryPlan(0, None, "available memory unknown: every routed expert resident")
    per_slot = max(0, int(state_bytes or 0))
    margin = margin_bytes(avail)
    fixed = model.dense + checkpoint_bytes + margin
    # Everything resident: the slots get what the weights leave, by the --slots rule (slot_budget.py).
    left = avail - fixed - model.experts
    if left >= per_slot * (slots_setting or 1):
        # slots None: the --slots rule (slot_budget.py) decides after the load, as without paging.
        return MemoryPlan(0, None, (
            f"{avail_source} {_gib(avail)} holds dense {_gib(model.dense)} + experts {_gib(model.experts)} + "
            f"checkpoints {_gib(checkpoint_bytes)} + {slots_setting or 1} state(s) at {STATE_PLAN_TOKENS} tokens "
            f"+ margin {_gib(margin)}: all resident"))
    slots = slots_setting or 1
    states = slots * per_slot
    budget = avail - fixed - states
    why = (f"{avail_source} {_gib(avail)} - dense {_gib(model.dense)} - checkpoints {_gib(checkpoint_bytes)} - "
           f"{slots} state(s) at {STATE_PLAN_TOKENS} tokens {_gib(states)} - margin {_gib(margin)} = "
           f"{_gib(max(budget, 0))} for {_gib(model.experts)} of routed experts")
    if budget < max(1, min_budget):
        return MemoryPlan(0, None, why + ": less than the kernel's least budget "
                                         f"({_gib(min_budget)}), so every routed expert stays resident; lower "
                                         "checkpoint_memory_mb or set expert_cache")
    return MemoryPlan(budget, slots, why + f" ({100 * budget / model.experts:.0f}% of them): paged")


def plan_state_tokens(context_length: int) -> int:
    return max(1, min(int(context_length), STATE_PLAN_TOKENS))


def is_routed_expert(name: str) -> bool:
    """A routed expert's weight or scale (canonical name `layers.L.ffn.experts.E.wN.*`); the shared
    expert (`ffn.shared_experts`) is dense: every token uses it."""
    return ".ffn.experts." in name


def split_weight_bytes(sizes) -> ModelBytes:
    """(canonical name, bytes) pairs -> dense and routed-expert bytes as stored (the kernel keeps
    FP8/FP4 expert bytes as they are; its own count is `expert_cache_info()` after the load)."""
    dense = experts = 0
    for name, n in sizes:
        if is_routed_expert(name):
            experts += int(n)
        else:
            dense += int(n)
    return ModelBytes(dense, experts)


