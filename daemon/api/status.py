"""`GET /v1/status`: what the daemon is doing now, for operators (`cairn status`) and dashboards.

The board is fed by the HTTP edge, which sees every reply of every request: `submitted` when a
request goes to admission, `seen` for each `Progress` / `Started` / `TokenOut`, `finished` when its
handler ends. A request the engine has ended (its `RequestControl.final` is set) no longer counts as
running or queued even while its handler is still writing to a slow client: status tells what the
engine is doing. Engine-wide numbers (queue depth, live state tokens) come from the metrics the
actors already keep; checkpoint numbers from `checkpoint_tiers`, the one hook for the store.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass, field

from cairn.actors.engine.messages import Progress, Started, TokenOut

TIERS = ("memory", "disk")


def version() -> str:
    try:
        from importlib.metadata import version as _v
        return _v("cairn")
    except Exception:  # pragma: no cover - not installed
        return "unknown"


def process_memory() -> dict:
    """Resident set size now (/proc/self/statm) and its peak (getrusage; Linux reports KiB)."""
    rss = None
    try:
        with open("/proc/self/statm") as fh:
            rss = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    rss = peak if rss is None else rss
    return {"rss_bytes": rss, "peak_rss_bytes": max(peak, rss)}


def checkpoint_tiers(engine) -> dict:
    """THE hook for checkpoint numbers: {"memory": {"count", "bytes", …}, "disk": {"count", "bytes", …}}.

    Asks the engine's checkpoint manager (`engine.checkpoints`, actors/checkpoints/views.py) for
    `checkpoint_stats()`, a plain dict with a sub-dict per tier ("entries"/"count", "bytes", budgets);
    the tier sub-dicts are passed through with "entries" spelled "count". Without a manager, or
    when it fails, every tier reads zero.
    """
    out: dict = {t: {"count": 0, "bytes": 0} for t in TIERS}
    ck = getattr(engine, "checkpoints", None)
    stats = getattr(ck, "checkpoint_stats", None)
    if stats is None:
        return out
    try:
        raw = stats()
    except Exception:          # status must answer even when the store is mid-update or broken
        return out
    for tier in TIERS:
        t = raw.get(tier)
        if isinstance(t, dict):
            out[tier] = {"count": int(t.get("count", t.get("entries", 0)) or 0), "bytes": int(t.get("bytes", 0) or 0),
                         **{k: v for k, v in t.items() if k not in ("count", "entries", "bytes")}}
    for key in ("enabled", "hits", "by_kind"):
        if key in raw:
            out[key] = raw[key]
    return out


def expert_cache(engine, reason: str = "") -> dict:
    """The routed-expert cache: budget and layout (the kernel's `expert_cache_info()`, read once
    at start: it does not change) and the work since start (the runner's totals of per-call deltas,
    actors/engine/expert_io.py — never a kernel call from here, which may be running one)."""
    runner = getattr(engine, "runner", None)
    meter = getattr(runner, "meter", None)
    out: dict = {"paged": bool(getattr(meter, "paged", False)), "reason": reason}
    info = getattr(meter, "info", None)
    if info:
        out |= info
    else:
        out["budget_bytes"] = int(getattr(meter, "budget_bytes", 0) or 0)
    total = getattr(meter, "total", None)
    if total is not None:
        out |= total.as_log()
    return out


def memory(engine, plan) -> dict:
    """RSS now and at peak, the memory plan (its parts, the limit and where it came from) and what
    the guard counts in use now (actors/engine/memory_guard.py)."""
    out = process_memory()
    if plan is not None:
        out["plan"] = plan.as_status()
    guard = getattr(engine, "memory", None)
    if guard is not None:
        try:
            out["in_use"] = guard.usage()
        except Exception:      # status must answer even mid-update
            pass
    return out


@dataclass
class Tracked:
    request_id: str
    prompt_tokens: int
    max_tokens: int
    submitted_at: float
    phase: str = "queued"            # queued | prefill | decode
    phase_since: float = 0.0
    done: int = 0                    # prefill: prompt tokens in the state; decode: tokens generated
    eta_s: float | None = None       # prefill: from the last Progress
    eta_at: float = 0.0
    reused_tokens: int = 0
    control: object = None           # the request's RequestControl: `final` is set once the engine ended it

    @property
    def ended(self) -> bool:
        """The engine has ended the request, though its handler may still be writing to the client."""
        return getattr(self.control, "final", None) is not None


@dataclass
class StatusBoard:
    engine: object = None            # cairn.actors.engine.engine.Engine (metrics, model, checkpoint store)
    queue_size: int | None = None
    fingerprint: str = ""
    context_length: int | None = None
    slots_reason: str = ""           # why the engine has this many slots (the setting, or the memory budget)
    expert_reason: str = ""          # why the expert cache has its budget (daemon/service/memory_plan.py)
    memory_plan: object = None       # daemon.service.memory_plan.MemoryPlan (None: no plan, no guard)
    replies: object = None           # daemon.protocol.reply_ids.ReplyTable (None: replies are not replayed)
    fingerprints: object = None      # daemon.api.cache_diagnostics.FingerprintTable (None: no cache diagnostics)
    started_at: float = field(default_factory=time.monotonic)
    requests: dict = field(default_factory=dict)

    # --- fed by the HTTP edge -------------------------------------------------------------------

    def submitted(self, rid: str, prompt_tokens: int, max_tokens: int, control=None) -> None:
        self.requests[rid] = Tracked(rid, prompt_tokens, max_tokens, time.monotonic(), control=control)

    def seen(self, rid: str, msg) -> None:
        t = self.requests.get(rid)
        if t is None:
            return
        now = time.monotonic()
        if isinstance(msg, Progress):
            if t.phase != "prefill":
                t.phase, t.phase_since = "prefill", now
            t.done, t.eta_s, t.eta_at = msg.done, msg.eta_s, now
        elif isinstance(msg, Started):
            t.phase, t.phase_since, t.done, t.reused_tokens = "decode", now, 0, msg.reused_tokens
        elif isinstance(msg, TokenOut):
            t.done += 1

    def finished(self, rid: str) -> None:
        self.requests.pop(rid, None)

    # --- read ------------------------------------------------------------------------------------

    def active(self) -> list[dict]:
        """Every request the engine is running (one per busy slot), the latest started first."""
        now = time.monotonic()
        live = [t for t in self.requests.values() if t.phase != "queued" and not t.ended]
        return [self._describe(t, now) for t in sorted(live, key=lambda r: r.phase_since, reverse=True)]

    def running(self) -> dict | None:
        """The latest started of the running requests (the only one with one slot)."""
        active = self.active()
        return active[0] if active else None

    @staticmethod
    def _describe(t: Tracked, now: float) -> dict:
        if t.phase == "prefill":
            total = t.prompt_tokens
            eta = None if t.eta_s is None else round(max(0.0, t.eta_s - (now - t.eta_at)), 2)
        else:
            total = t.max_tokens
            elapsed = now - t.phase_since
            rate = t.done / elapsed if elapsed > 0 and t.done > 0 else None
            eta = None if rate is None else round((total - t.done) / rate, 2)   # upper bound: EOS may come first
        return {"id": t.request_id, "phase": t.phase, "tokens_done": t.done, "tokens_total": total,
                "eta_s": eta, "prompt_tokens": t.prompt_tokens,
                "elapsed_s": round(now - t.submitted_at, 3)}

    def load(self) -> dict:
        """The load figure a gateway balances on (GET /v1/loads, daemon/api/worker_info.py): requests the
        engine is running and holding in its queue, and the prompt tokens still to prefill (the
        running prefill's rest plus every queued prompt). Ended requests do not count."""
        running = waiting = pending = queued_tokens = 0
        for t in self.requests.values():
            if t.ended:
                continue
            if t.phase == "queued":
                waiting += 1
                pending += t.prompt_tokens
                queued_tokens += t.prompt_tokens
            else:
                running += 1
                if t.phase == "prefill":
                    pending += max(0, t.prompt_tokens - t.done)
        return {"running": running, "waiting": waiting, "pending_prefill_tokens": pending,
                "queued_prompt_tokens": queued_tokens, "live_tokens": live_tokens(self.engine)}

    def snapshot(self, model_id: str) -> dict:
        engine = self.engine
        metrics = getattr(engine, "metrics", None)
        model = getattr(engine, "model", None)
        waiting = sum(t.phase == "queued" and not t.ended for t in self.requests.values())
        depth = int(metrics.queue_depth.value()) if metrics is not None else waiting
        live = int(metrics.live_state_tokens.value()) if metrics is not None else 0
        active = self.active()   # read once: `running` is its first entry, the same elapsed time
        return {
            "object": "status",
            "version": version(),
            "pid": os.getpid(),
            "uptime_s": round(time.monotonic() - self.started_at, 3),
            "model": {"id": model_id, "fingerprint": self.fingerprint, "context_length": self.context_length,
                      "kernel_threads": None if model is None else int(getattr(model, "threads", 0))},
            "engine": {"segment": getattr(engine, "segment", None), "chunk": getattr(engine, "chunk", None),
                       "slots": max(1, len(getattr(engine, "slots", None) or ())),
                       "slots_reason": self.slots_reason},
            "queue": {"depth": depth, "capacity": self.queue_size},
            "running": active[0] if active else None,
            "active": active,   # every running request; `running` is the first of them
            # what each sequence slot's live state holds and does (one entry per slot, 1 included)
            "slots": [s.describe() for s in (getattr(engine, "slots", None) or ())],
            "live_state_tokens": live,
            "checkpoints": checkpoint_tiers(engine),
            "expert_cache": expert_cache(engine, self.expert_reason),
            "memory": memory(engine, self.memory_plan),
            # finished replies' generated ids, replayed when a later prompt holds the reply again
            "replies": self.replies.stats() if self.replies is not None else None,
            # prompts compared with earlier ones: the table, and the latest misses and shortfalls with
            # their figures (daemon/api/cache_diagnostics.py)
            "cache_diagnostics": self.fingerprints.stats() if self.fingerprints is not None else None,
        }


def live_tokens(engine) -> int:
    """Tokens in the live states now, every slot's (the live-state gauge is only set when a turn ends,
    so mid-request it lags: a gateway balancing on it would see a stale figure)."""
    if engine is None:
        return 0
    return sum(s.figures.n_tokens for s in engine.slots)   # published figures: a state may be in a kernel call
