"""What the routed-expert cache did during kernel calls: hits, misses, bytes read from disk, time.

The kernel keeps cumulative counters (`model.expert_cache_stats()`); every kernel call runs alone
in the kernel thread (kernel_thread.py, behind the kernel gate), so the difference of two
samples taken in that thread just before and after a call is that call's work. `ExpertMeter`
takes the samples and totals them engine-wide (/metrics, /v1/status); an `ExpertTally` sums the
deltas of the calls made for one purpose (a prefill segment, a request). Plain objects: the
runner adds a delta after the thread call has returned, on the Trio thread.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, fields

@dataclass(frozen=True, slots=True)
class ExpertIO:
    hits: int = 0                # expert lookups served from the cache
    misses: int = 0              # lookups that read the expert from disk
    bytes_read: int = 0
    read_s: float = 0.0          # time spent reading (may overlap compute)
    stall_s: float = 0.0         # compute waited for a read
    evictions: int = 0
    prefetch_reads: int = 0      # reads issued ahead of their call (in bytes_read too)
    prefetch_used: int = 0       # of those, used by their call (counted as hits)
    lookahead_guesses: int = 0   # experts the router lookahead predicted for the next layer
    lookahead_right: int = 0     # of those, the ones that layer used

    @classmethod
    def from_stats(cls, d: dict) -> "ExpertIO":
        return cls(int(d.get("hits", 0)), int(d.get("misses", 0)), int(d.get("bytes_read", 0)),
                   float(d.get("read_seconds", 0.0)), float(d.get("stall_seconds", 0.0)),
                   int(d.get("evictions", 0)), int(d.get("prefetch_reads", 0)), int(d.get("prefetch_used", 0)),
                   int(d.get("lookahead_guesses", 0)), int(d.get("lookahead_right", 0)))

    def __add__(self, o: "ExpertIO") -> "ExpertIO":
        return ExpertIO(*(getattr(self, f.name) + getattr(o, f.name) for f in fields(self)))

    def __sub__(self, o: "ExpertIO") -> "ExpertIO":
        return ExpertIO(*(getattr(self, f.name) - getattr(o, f.name) for f in fields(self)))

    @property
    def lookups(self) -> int:
        return self.hits + self.misses

    @property
    def hit_rate(self) -> float | None:
        return None if self.lookups == 0 else self.hits / self.lookups

    def as_log(self) -> dict:
        """The fields of a log line or a status block (rounded; hit_rate None without lookups)."""
        hr = self.hit_rate
        out = {"hit_rate": None if hr is None else round(hr, 4), "hits": self.hits, "misses": self.misses,
               "bytes_read": self.bytes_read, "read_s": round(self.read_s, 4), "stall_s": round(self.stall_s, 4),
               "evictions": self.evictions}
        if self.prefetch_reads or self.lookahead_guesses:
            g = self.lookahead_guesses
            out |= {"prefetch_reads": self.prefetch_reads, "prefetch_used": self.prefetch_used,
                    "lookahead_guesses": g, "lookahead_right": self.lookahead_right,
                    "lookahead_precision": None if not g else round(self.lookahead_right / g, 4)}
        return out


ZERO = ExpertIO()


class ExpertTally:
    """The sum of the deltas added to it (one prefill segment, one request)."""

    __slots__ = ("io",)

    def __init__(self) -> None:
        self.io = ZERO

    def add(self, io: ExpertIO) -> None:
        if io is not ZERO:         # no expert paged (every decode step of a resident model): nothing to add
            self.io = self.io + io


class ExpertMeter:
    """Samples the model's cumulative counters around kernel calls; totals and metrics engine-wide.

    `paged` is False for a model without an expert cache (a fake, or every expert resident with a
    kernel that keeps no counters then): the runner skips the samples altogether."""

    def __init__(self, model, metrics=None) -> None:
        self._stats = getattr(model, "expert_cache_stats", None)
        info = getattr(model, "expert_cache_info", None)
        try:
            self.info = {k: (v if isinstance(v, (bool, str)) else int(v)) for k, v in dict(info()).items()} \
                if info is not None else {}
        except Exception:          # a description only
            self.info = {}
        budget = int(self.info.get("budget_bytes", 0))
        self.paged = self._stats is not None and budget > 0
        self.budget_bytes = budget
        self.metrics = metrics
        if metrics is not None and getattr(metrics, "expert_budget", None) is not None:
            metrics.expert_budget.set(budget)
        self._lock = threading.Lock()
        self.total = ZERO

    def sample(self) -> ExpertIO:
        """In the kernel thread, with no kernel call running."""
        return ExpertIO.from_stats(self._stats())

    def record(self, io: ExpertIO) -> None:
        with self._lock:
            self.total = self.total + io
        m = self.metrics
        if m is not None and getattr(m, "expert_hits", None) is not None:
            m.expert_hits.inc(io.hits)
            m.expert_misses.inc(io.misses)
            m.expert_bytes_read.inc(io.bytes_read)
            m.expert_read_seconds.inc(max(0.0, io.read_s))
            m.expert_stall_seconds.inc(max(0.0, io.stall_s))
            m.expert_evictions.inc(io.evictions)
            m.expert_prefetch_reads.inc(io.prefetch_reads)
            m.expert_prefetch_used.inc(io.prefetch_used)
            m.expert_lookahead_guesses.inc(io.lookahead_guesses)
            m.expert_lookahead_right.inc(io.lookahead_right)
