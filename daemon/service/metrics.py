"""A dependency-free Prometheus registry and the metric set of the daemon.

Design notes:
- No globals: a `Metrics` owns a `Registry` and its metrics; the daemon makes one and passes it to
  the actors that record, tests make their own.
- `render()` writes text exposition format 0.0.4 (serve it with `CONTENT_TYPE`). Counters keep the
  `_total` suffix in their declared name, as that format expects.
- Labels are keyword arguments checked against the declared names; a metric may also fix the allowed
  values of a label (`outcome`, `kind`), so a typo raises instead of creating a stray series. Known
  values are created at zero so every series exists from the first scrape.
- Each metric has a lock: the kernel runs in worker threads, and a metric may be updated from there.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Iterable, Mapping, Sequence

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

BACKSLASH, NEWLINE = "\\", "\n"
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def _fmt(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return str(int(value)) if value == int(value) and abs(value) < 2**53 else repr(float(value))


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)
    return "{" + body + "}" if body else ""


class _Metric:
    type = ""

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = (),
                 allowed: Mapping[str, Sequence[str]] | None = None) -> None:
        if not _NAME.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        for label in labelnames:
            if not _LABEL.match(label) or label == "le" or label.startswith("__"):
                raise ValueError(f"invalid label name {label!r} for {name}")
        self.name, self.help, self.labelnames = name, help, tuple(labelnames)
        self.allowed = {k: frozenset(v) for k, v in (allowed or {}).items()}
        self._lock = threading.Lock()
        self._series: dict[tuple[str, ...], object] = {}
        if self.allowed and set(self.allowed) == set(self.labelnames):
            self._precreate([dict(zip(self.allowed, combo)) for combo in _product(self.allowed.values())])
        elif not self.labelnames:
            self._precreate([{}])

    def _precreate(self, label_sets: list[dict[str, str]]) -> None:
        for labels in label_sets:
            self._series[self._key(labels)] = self._new()

    def _key(self, labels: Mapping[str, str]) -> tuple[str, ...]:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {tuple(labels)}")
        for k, v in labels.items():
            if not isinstance(v, str):
                raise TypeError(f"{self.name}: label {k} must be a str, got {type(v).__name__}")
            if k in self.allowed and v not in self.allowed[k]:
                raise ValueError(f"{self.name}: {k}={v!r} not one of {sorted(self.allowed[k])}")
        return tuple(labels[k] for k in self.labelnames)

    def _new(self):
        return 0.0

    def touch(self, **labels: str) -> None:
        """Create the series for `labels` at zero if it does not exist yet, so it shows on a scrape."""
        key = self._key(labels)
        with self._lock:
            self._series.setdefault(key, self._new())

    def value(self, **labels: str) -> float:
        with self._lock:
            return self._series.get(self._key(labels), 0.0)

    def render(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help.replace(BACKSLASH, BACKSLASH * 2).replace(NEWLINE, BACKSLASH + 'n')}",
               f"# TYPE {self.name} {self.type}"]
        with self._lock:
            for key, value in sorted(self._series.items()):
                out.extend(self._samples(list(zip(self.labelnames, key)), value))
        return out

    def _samples(self, pairs, value) -> list[str]:
        return [f"{self.name}{_labels(pairs)} {_fmt(value)}"]


def _product(pools: Iterable[Iterable[str]]) -> list[tuple[str, ...]]:
    combos: list[tuple[str, ...]] = [()]
    for pool in pools:
        combos = [c + (v,) for c in combos for v in sorted(pool)]
    return combos


class Counter(_Metric):
    type = "counter"

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError(f"{self.name}: counters only go up (got {amount})")
        key = self._key(labels)
        with self._lock:
            self._series[key] = self._series.get(key, 0.0) + amount


class Gauge(_Metric):
    type = "gauge"

    def set(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._series[key] = float(value)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._series[key] = self._series.get(key, 0.0) + amount

    def dec(self, amount: float = 1.0, **labels: str) -> None:
        self.inc(-amount, **labels)


class Histogram(_Metric):
    type = "histogram"

    def __init__(self, name: str, help: str, buckets: Sequence[float], labelnames: Sequence[str] = ()) -> None:
        bounds = sorted(float(b) for b in buckets)
        if not bounds or len(set(bounds)) != len(bounds):
            raise ValueError(f"{name}: buckets must be distinct and non-empty")
        self.buckets = tuple(bounds) + ((math.inf,) if bounds[-1] != math.inf else ())
        super().__init__(name, help, labelnames)

    def _new(self):
        return [[0] * len(self.buckets), 0.0]  # [per-bucket counts (not cumulative), sum]

    def observe(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            series = self._series.setdefault(key, self._new())
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    series[0][i] += 1
                    break
            series[1] += value

    def count(self, **labels: str) -> int:
        with self._lock:
            series = self._series.get(self._key(labels))
            return sum(series[0]) if series else 0

    def sum(self, **labels: str) -> float:
        with self._lock:
            series = self._series.get(self._key(labels))
            return series[1] if series else 0.0

    value = sum

    def _samples(self, pairs, series) -> list[str]:
        counts, total = series
        out, cumulative = [], 0
        for bound, n in zip(self.buckets, counts):
            cumulative += n
            out.append(f"{self.name}_bucket{_labels(pairs + [('le', _fmt_le(bound))])} {cumulative}")
        out.append(f"{self.name}_sum{_labels(pairs)} {_fmt(total)}")
        out.append(f"{self.name}_count{_labels(pairs)} {cumulative}")
        return out


def _fmt_le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(bound)


class Registry:
    """Metrics in registration order; `render()` is the body of a /metrics response."""

    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}

    def register(self, metric: _Metric) -> _Metric:
        if metric.name in self._metrics:
            raise ValueError(f"metric {metric.name} registered twice")
        self._metrics[metric.name] = metric
        return metric

    def counter(self, name: str, help: str, labelnames: Sequence[str] = (), **kw) -> Counter:
        return self.register(Counter(name, help, labelnames, **kw))

    def gauge(self, name: str, help: str, labelnames: Sequence[str] = (), **kw) -> Gauge:
        return self.register(Gauge(name, help, labelnames, **kw))

    def histogram(self, name: str, help: str, buckets: Sequence[float], labelnames: Sequence[str] = ()) -> Histogram:
        return self.register(Histogram(name, help, buckets, labelnames))

    def render(self) -> str:
        lines: list[str] = []
        for metric in self._metrics.values():
            lines.extend(metric.render())
        return "\n".join(lines) + "\n"


OUTCOMES = ("done", "cancelled", "error", "rejected")
PREFILL_KINDS = ("computed", "reused", "restored")
SLOT_PHASES = ("idle", "prefill", "decode")
# Prefill on CPU runs from milliseconds (a restored checkpoint) to minutes (a long cold prompt).
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
DECODE_TPS_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0)


class Metrics:
    """The daemon's metric set. `tiers` (e.g. ("ram", "disk")) pre-creates per-tier series at zero."""

    def __init__(self, tiers: Sequence[str] = ()) -> None:
        r = self.registry = Registry()
        self.requests = r.counter("cairn_requests_total", "Requests finished, by outcome.", ["outcome"],
                                  allowed={"outcome": OUTCOMES})
        self.cancels = r.counter("cairn_cancels_total", "Requests cancelled by the client or by shutdown.")
        self.queue_depth = r.gauge("cairn_queue_depth", "Requests admitted and waiting for the model.")
        self.prefill_tokens = r.counter("cairn_prefill_tokens_total",
                                        "Prompt tokens by how their state was obtained.", ["kind"],
                                        allowed={"kind": PREFILL_KINDS})
        self.checkpoint_hits = r.counter("cairn_checkpoint_hits_total", "Prefix checkpoint hits, by tier.", ["tier"])
        self.checkpoint_misses = r.counter("cairn_checkpoint_misses_total", "Prefix checkpoint misses, by reason.",
                                           ["reason"])
        self.checkpoint_evictions = r.counter("cairn_checkpoint_evictions_total", "Checkpoints evicted, by tier.",
                                              ["tier"])
        self.checkpoint_bytes = r.gauge("cairn_checkpoint_bytes", "Bytes held by checkpoints, by tier.", ["tier"])
        self.ttft = r.histogram("cairn_ttft_seconds", "Time from request arrival to its first token.", TTFT_BUCKETS)
        self.decode_tps = r.histogram("cairn_decode_tokens_per_second", "Decode speed of each finished request.",
                                      DECODE_TPS_BUCKETS)
        self.live_state_tokens = r.gauge("cairn_live_state_tokens", "Tokens held in the live model state.")
        # what the sequence slots do (one or more), and how full the batched decode steps are
        self.slots = r.gauge("cairn_slots", "Sequence slots by what they do.", ["phase"],
                             allowed={"phase": SLOT_PHASES})
        self.decode_steps = r.counter("cairn_decode_steps_total", "Decode kernel steps (one per step, whatever its batch size).")
        self.decode_step_rows = r.counter("cairn_decode_step_rows_total",
                                          "Sequence tokens advanced by batched decode steps (rows / steps: "
                                          "the mean batch).")
        # exact speculative decoding (actors/decoding/speculation.py): tokens per kernel call =
        # (decode tokens) / decode_steps; acceptance = accepted / draft tokens
        self.decode_tokens = r.counter("cairn_decode_tokens_total", "Tokens decode picked (all requests).")
        self.spec_drafts = r.counter("cairn_spec_drafts_total", "Drafts verified (one verify call each, per sequence).")
        self.spec_draft_tokens = r.counter("cairn_spec_draft_tokens_total", "Draft tokens fed for verification.")
        self.spec_accepted_tokens = r.counter("cairn_spec_accepted_tokens_total",
                                              "Draft tokens the reply kept (each one a token without its own step).")
        self.spec_batched_verify_steps = r.counter(
            "cairn_spec_batched_verify_steps_total",
            "Decode steps that verified drafts for two or more sequences in one kernel call.")
        # the memory plan (daemon/service/memory_plan.py) and its guard (actors/engine/memory_guard.py)
        self.memory_refused = r.counter("cairn_memory_refused_total",
                                        "Requests ended because their state could not grow within the memory plan.")
        self.checkpoint_captures_skipped = r.counter(
            "cairn_checkpoint_captures_skipped_total", "Captures not taken because their snapshot could not be "
            "kept (budget: larger than the checkpoint budget; transient_room: no room for the copy).", ["reason"],
            allowed={"reason": ("budget", "transient_room")})
        # paged routed experts (--expert-cache; actors/engine/expert_io.py): the kernel's counters, summed over calls
        self.expert_budget = r.gauge("cairn_expert_cache_budget_bytes",
                                     "Memory for routed experts (0: every expert resident, nothing paged).")
        self.expert_hits = r.counter("cairn_expert_cache_hits_total", "Routed-expert lookups served from memory.")
        self.expert_misses = r.counter("cairn_expert_cache_misses_total",
                                       "Routed-expert lookups that read the expert from disk.")
        self.expert_bytes_read = r.counter("cairn_expert_cache_read_bytes_total",
                                           "Bytes of routed experts read from disk.")
        self.expert_read_seconds = r.counter("cairn_expert_cache_read_seconds_total",
                                             "Time spent reading routed experts (overlaps compute).")
        self.expert_stall_seconds = r.counter("cairn_expert_cache_stall_seconds_total",
                                              "Time the compute waited for routed-expert reads.")
        self.expert_evictions = r.counter("cairn_expert_cache_evictions_total",
                                          "Routed experts evicted from the cache to make room.")
        self.expert_prefetch_reads = r.counter("cairn_expert_prefetch_reads_total",
                                               "Routed experts read ahead of their layer (--expert-prefetch).")
        self.expert_prefetch_used = r.counter("cairn_expert_prefetch_used_total",
                                              "Experts read ahead that their layer then used.")
        self.expert_lookahead_guesses = r.counter("cairn_expert_lookahead_guesses_total",
                                                  "Experts the router lookahead predicted for the next layer.")
        self.expert_lookahead_right = r.counter("cairn_expert_lookahead_right_total",
                                                "Predicted experts the next layer then used.")
        for tier in tiers:
            for metric in (self.checkpoint_hits, self.checkpoint_evictions, self.checkpoint_bytes):
                metric.touch(tier=tier)

    def render(self) -> str:
        return self.registry.render()
