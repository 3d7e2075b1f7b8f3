"""The canonical log line: one per request, whatever its outcome."""

from __future__ import annotations

import trio


def log_request(log, submit, *, outcome: str, arrived_at: float, reused: int,
                first_token_at: float | None = None, completion_tokens: int = 0,
                decode_s: float = 0.0, finish_reason: str | None = None, error: str | None = None,
                metrics=None, slot: int | None = None, speculation: dict | None = None) -> None:
    now = trio.current_time()
    if metrics is not None:
        metrics.requests.inc(outcome=outcome)
        if outcome == "cancelled":
            metrics.cancels.inc()
        if first_token_at is not None:
            metrics.ttft.observe(first_token_at - arrived_at)
        if decode_s > 0 and completion_tokens > 1:
            metrics.decode_tps.observe((completion_tokens - 1) / decode_s)
    log.info(
        "request",
        request_id=submit.request_id,
        prompt_tokens=len(submit.prompt),
        reused_tokens=reused,
        computed_tokens=len(submit.prompt) - reused,
        completion_tokens=completion_tokens,
        ttft_ms=None if first_token_at is None else round((first_token_at - arrived_at) * 1000, 1),
        decode_tok_s=round((completion_tokens - 1) / decode_s, 1) if decode_s > 0 and completion_tokens > 1 else None,
        total_ms=round((now - arrived_at) * 1000, 1),
        trace_ms=submit.trace.ms(arrived_at, first_token_at),
        outcome=outcome,
        finish_reason=finish_reason,
        **({"error": error} if error else {}),
        **({"slot": slot} if slot is not None else {}),   # which sequence slot's live state served it
        **({"speculation": speculation} if speculation else {}),   # drafts, drafted, accepted, calls, off, no_room
        **({"experts": experts} if (experts := submit.trace.experts()) is not None else {}),
        **({"decode_kernel_ms": round(submit.trace.decode_kernel_s * 1000, 2),
            "decode_kernel_cpu_ms": round(submit.trace.decode_kernel_cpu_s * 1000, 2)} if completion_tokens > 1 else {}),
        **({"spans_us": submit.trace.spans.us()} if submit.trace.spans is not None else {}),
    )
