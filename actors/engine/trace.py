"""Where one request's time goes before its first token: a few marks and sums, one dict in the log.

Design notes. Each stage writes its own marks on the request's `RequestTrace` (a plain Trio-thread
object carried by `Submit`, like `RequestControl`): the HTTP edge when it starts and when it hands
the request over, the prefill worker around planning and each kernel call / snapshot, the decode
worker when the first token is chosen. All times are `trio.current_time()`. The canonical log line
(outcome.py) shows `ms()`: cheap enough to keep on for every request (a few floats).
"""

from __future__ import annotations

from .expert_io import ExpertTally


class RequestTrace:
    __slots__ = ("received_at", "submitted_at", "prefill_at", "planned_at", "prefilled_at",
                 "kernel_s", "kernel_calls", "snapshot_s", "snapshots", "prefill_experts", "decode_experts",
                 "reuse", "decode_kernel_s", "decode_kernel_cpu_s", "spans")

    def __init__(self, received_at: float | None = None, spans=None) -> None:
        self.received_at = received_at      # the HTTP handler started (before the body is read)
        self.submitted_at: float | None = None   # parsed, validated, tokenized: sent to admission
        self.prefill_at: float | None = None     # the prefill worker took it
        self.planned_at: float | None = None     # plan made, state ready (restored / new / live)
        self.prefilled_at: float | None = None   # last kernel call and snapshot done
        self.kernel_s = 0.0                      # prefill kernel calls, as the worker waited for them
        self.kernel_calls = 0
        self.snapshot_s = 0.0                    # snapshots + storing them
        self.snapshots = 0
        # Paged experts (actors/engine/expert_io.py): the expert-cache work of this request's kernel calls;
        # decode steps batched with other requests (several slots) count the whole step for each of them.
        self.prefill_experts = ExpertTally()
        self.decode_experts = ExpertTally()
        # where the prompt's reused tokens came from, set by the prefill worker once planned (the edge's
        # cache diagnostics read it): {"from": "live_state" | "checkpoint" | "none", ...}
        self.reuse: dict | None = None
        # decode: the request's kernel calls' own time, as the kernel thread measured it (a batched
        # step counts whole for each request in it); the log line's `decode_kernel_ms`
        self.decode_kernel_s = 0.0
        self.decode_kernel_cpu_s = 0.0           # ... and the CPU the kernel thread used for them
        self.spans = spans                       # actors/engine/spans.Spans when CAIRN_DECODE_SPANS=1, else None

    def experts(self) -> dict | None:
        """The request's expert-cache work for its log line; None when no expert was paged."""
        pre, dec = self.prefill_experts.io, self.decode_experts.io
        if pre.lookups == 0 and dec.lookups == 0:
            return None
        return {"prefill": pre.as_log(), "decode": dec.as_log()}

    def ms(self, arrived_at: float, first_token_at: float | None) -> dict:
        """Milliseconds per stage (stages not reached are left out); `arrived_at`: admission's time."""
        out: dict = {}

        def span(name: str, a: float | None, b: float | None) -> None:
            if a is not None and b is not None:
                out[name] = round((b - a) * 1000, 2)

        span("edge", self.received_at, self.submitted_at)       # body, parse, validate, tokenize
        span("queue", self.submitted_at if self.submitted_at is not None else arrived_at, self.prefill_at)
        span("plan", self.prefill_at, self.planned_at)            # plan + restore / new state
        if self.kernel_calls:
            out["kernel"] = round(self.kernel_s * 1000, 2)
            out["kernel_calls"] = self.kernel_calls
        if self.snapshots:
            out["snapshot"] = round(self.snapshot_s * 1000, 2)
            out["snapshots"] = self.snapshots
        if self.planned_at is not None and self.prefilled_at is not None:
            rest = self.prefilled_at - self.planned_at - self.kernel_s - self.snapshot_s
            out["prefill_other"] = round(rest * 1000, 2)         # logs, progress, metrics between calls
        span("first_token", self.prefilled_at, first_token_at)   # hand-off to decode, sampling
        span("total", self.received_at, first_token_at)
        return out
