"""Prefill worker actor: decide where to start, then run segments of chunks in the kernel thread.

Design notes. A request's cancel scope (attached through its RequestControl) covers the whole
prefill; each segment is one abortable kernel call, so a cancel stops the kernel at the next chunk
boundary and the live state keeps every completed chunk — an identical retry extends it and
resumes there. `Finished` goes to admission only after the kernel call has returned, which is what
lets admission hold the engine until the state is consistent. One log line per segment.
"""

from __future__ import annotations

import numpy as np
import trio

from .engine import Engine
from .messages import Admitted, CancelAck, Failed, Finished, Prefilled, PromptLogprobs
from .outcome import log_request
from .replies import reply_nowait
from .sampling import log_softmax, top_logprobs
from .start import decide_start

ALL_LOGITS_BUDGET = 1 << 26   # floats of [n, V] logits one segment may return (256 MiB) with all_logits


def segment_length(segment: int, chunk: int, vocab_size: int, all_logits: bool) -> int:
    """Tokens per kernel call. With every position's logits, shorter so [n, V] stays bounded."""
    if not all_logits:
        return segment
    return max(chunk, min(segment, ALL_LOGITS_BUDGET // max(vocab_size, 1) // chunk * chunk))


class PrefillError(RuntimeError):
    pass


def _prefill_with_logprobs(kernel, state, tokens, prev_row, k, *, chunk, abort):
    """Kernel thread: prefill with every position's logits, reduced at once to log-probs.

    Returns (n_done, last logits [V], logprobs of tokens[j] for j in 0..n_done-1 given the previous
    position, their top-k). `prev_row` is the logits row before tokens[0] (None at position 0).
    """
    n_done, rows = kernel.prefill(state, tokens, chunk=chunk, abort=abort, all_logits=True)  # [n_done, V]
    lps, tops = [], []
    prev = prev_row
    for j in range(n_done):
        if prev is None:
            lps.append(None)
            tops.append(())
        else:
            lp = log_softmax(prev)
            lps.append(float(lp[tokens[j]]))
            tops.append(top_logprobs(lp, k))
        prev = rows[j]
    return n_done, (rows[n_done - 1] if n_done else prev_row), lps, tops


async def run_prefill(engine: Engine, submit, log, progress: dict | None = None
                      ) -> tuple[np.ndarray, int, PromptLogprobs | None]:
    """Prefill `submit.prompt` into the live state. Returns (next-token logits [V], reused, prompt logprobs).
    `progress["reused"]` is set as soon as it is known (for the log line of a cancelled prefill)."""
    prompt = list(submit.prompt)
    live = engine.live
    start = decide_start(engine.live_tokens(), live is not None and live.last_logits is not None, prompt,
                         need_all_logits=submit.prompt_logprobs)
    state = engine.new_state() if start.fresh else live
    reused = start.reuse
    if progress is not None:
        progress["reused"] = reused
    log.info("prefill_plan", request_id=submit.request_id, prompt_tokens=len(prompt), reused_tokens=reused,
             fresh=start.fresh, live_tokens=0 if live is None else int(live.n_tokens))
    tail = np.asarray(prompt[reused:], dtype=np.int32)      # [n_tail]
    if engine.metrics is not None:
        engine.metrics.prefill_tokens.inc(reused, kind="reused")
    if len(tail) == 0:
        return np.asarray(state.last_logits), reused, None

    k = submit.sampling.top_logprobs if submit.prompt_logprobs else 0
    lps: list = []
    tops: list = []
    prev_row = None
    logits = None
    t_begin = trio.current_time()
    seg_len = segment_length(engine.segment, engine.chunk, int(engine.model.vocab_size), submit.prompt_logprobs)
    for seg_start in range(0, len(tail), seg_len):
        seg = tail[seg_start: seg_start + seg_len]
        t0 = trio.current_time()
        if submit.prompt_logprobs:
            n_done, logits, seg_lps, seg_tops = await engine.runner.run(
                _prefill_with_logprobs, engine.kernel, state, seg, prev_row, k, chunk=engine.chunk,
                abortable=True)
            lps += seg_lps
            tops += seg_tops
            prev_row = logits
        else:
            n_done, logits = await engine.runner.run(engine.kernel.prefill, state, seg, chunk=engine.chunk,
                                                     abortable=True)
        now = trio.current_time()
        done = seg_start + n_done
        if engine.metrics is not None:
            engine.metrics.prefill_tokens.inc(n_done, kind="computed")
        rate = done / max(now - t_begin, 1e-9)
        log.info("prefill_segment", request_id=submit.request_id, tokens_done=reused + done,
                 tokens_total=len(prompt), tok_s=round(n_done / max(now - t0, 1e-9), 1),
                 eta_s=round((len(tail) - done) / rate, 2) if rate > 0 else None)
        if n_done < len(seg):
            # Only an abort stops the kernel early; the cancel itself arrives at the next checkpoint.
            await trio.lowlevel.checkpoint()
            raise PrefillError(f"kernel stopped after {n_done} of {len(seg)} tokens without a cancel")
    prompt_lp = PromptLogprobs(tuple(lps), tuple(tops)) if submit.prompt_logprobs else None
    return np.asarray(logits), reused, prompt_lp


async def prefill_worker(inbox: trio.MemoryReceiveChannel, to_decode: trio.MemorySendChannel,
                         to_admission: trio.MemorySendChannel, *, engine: Engine, log,
                         task_status=trio.TASK_STATUS_IGNORED) -> None:
    async with inbox, to_decode, to_admission:
        task_status.started()
        async for adm in inbox:
            adm: Admitted
            sub = adm.submit
            result = error = None
            progress: dict = {}
            with trio.CancelScope() as scope:
                sub.control.attach(scope)
                try:
                    result = await run_prefill(engine, sub, log, progress)
                except (PrefillError, RuntimeError, ValueError, MemoryError) as e:
                    error = f"{type(e).__name__}: {e}"
                    engine.discard_live()
                except trio.Cancelled:
                    if not sub.control.cancel_requested:   # shutdown: say so, then let it through
                        log_request(log, sub, metrics=engine.metrics, outcome="cancelled",
                                    arrived_at=adm.arrived_at, reused=progress.get("reused", 0), error="shutdown")
                    raise
            sub.control.detach()
            engine.note_live_tokens()
            if scope.cancelled_caught:
                live = engine.live
                log_request(log, sub, metrics=engine.metrics, outcome="cancelled", arrived_at=adm.arrived_at,
                            reused=progress.get("reused", 0))
                log.info("prefill_cancelled", request_id=sub.request_id,
                         state_tokens=0 if live is None else int(live.n_tokens))
                reply_nowait(sub, CancelAck(sub.request_id))
                await to_admission.send(Finished(sub.request_id, "cancelled"))
            elif error is not None:
                log.error("prefill_failed", request_id=sub.request_id, error=error)
                log_request(log, sub, metrics=engine.metrics, outcome="error", arrived_at=adm.arrived_at,
                            reused=0, error=error)
                reply_nowait(sub, Failed(error))
                await to_admission.send(Finished(sub.request_id, "error"))
            else:
                logits, reused, prompt_lp = result
                await to_decode.send(Prefilled(sub, logits, reused, prompt_lp, adm.arrived_at))
