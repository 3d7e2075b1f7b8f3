"""Decode worker actor: sample, stream tokens back, feed them to the live state.

What the live state holds after a turn: the prompt plus every generated token but the last (the
last one is never fed — nothing needs its logits), so `state.tokens` is exactly what the next turn
can extend. A cancel (client gone, shutdown) stops between tokens; a token being decoded finishes
first, so the state stays consistent. Text is assembled as UTF-8 across token boundaries
(StreamDecoder) and held back while it could still start a stop string (StopMatcher).
"""

from __future__ import annotations

import trio

from .engine import Engine
from .lifecycle import ClientGone, attached, end_cancelled, end_failed
from .messages import Done, Finished, Prefilled, Started, TokenOut, Usage
from .outcome import log_request
from .penalties import Shaper
from .replies import finish, reply
from .sampling import choose, log_softmax, make_rng, top_logprobs
from .stops import StopMatcher


# Sampling and log-probabilities are O(V) numpy work per token (a few ms at V = 129k, more on a busy
# machine): for vocabularies this large they run in a worker thread, off the event loop.
OFF_LOOP_VOCAB = 16384


def _pick(logits, shaper: Shaper, allowed, s, rng) -> tuple[int, float, tuple]:
    """The next token (chosen from the shaped logits: penalties, biases, grammar mask), and its
    log-probability and top alternatives under the model's own logits when the request asks for them."""
    tok = choose(shaper.shape(logits, allowed), s, rng)
    if not s.logprobs:
        return tok, 0.0, ()
    row = log_softmax(logits)
    return tok, float(row[tok]), top_logprobs(row, s.top_logprobs)


async def _send(sub, msg) -> None:
    """Waits for room in the reply buffer; `ClientGone` when the handler left or stopped reading."""
    if not await reply(sub, msg):
        # The handler still holds its end: it is alive but has not read for replies.STALL_S.
        raise ClientGone(stalled=sub.reply.statistics().open_receive_channels > 0)


async def run_decode(engine: Engine, pre: Prefilled, stream_decoder, stats: dict) -> Done:
    sub = pre.submit
    s = sub.sampling
    rng = make_rng(s.seed)
    stops = StopMatcher(s.stop)
    eos = getattr(engine.tokenizer, "eos_id", None)
    budget = max(0, min(s.max_tokens, engine.context_length - len(sub.prompt)))
    await _send(sub, Started(pre.reused_tokens, pre.prompt_logprobs))
    logits = pre.logits
    n = 0
    finish_reason = "length"
    by_stop_string = False
    off_loop = int(engine.model.vocab_size) >= OFF_LOOP_VOCAB
    shaper = Shaper(s, len(logits))
    while n < budget:
        allowed = None
        if s.constraint is not None:  # the grammar mask, off the event loop (llguidance drops the GIL)
            allowed = await trio.to_thread.run_sync(s.constraint.allowed)
        if off_loop:   # never abandoned: the thread owns `rng` until it returns (it is bounded)
            tok, lp, top = await trio.to_thread.run_sync(_pick, logits, shaper, allowed, s, rng)
        else:
            tok, lp, top = _pick(logits, shaper, allowed, s, rng)
        shaper.accept(tok)
        n += 1
        stats["completion_tokens"] = n
        if n == 1:
            stats["first_token_at"] = trio.current_time()
        if tok == eos and not s.ignore_eos:
            finish_reason = "stop"
            break
        text, stopped = stops.push(stream_decoder.push(tok))
        await _send(sub, TokenOut(tok, text, lp, top))
        if stopped:
            finish_reason, by_stop_string = "stop", True
            break
        if n == budget:
            break
        engine.room_for(engine.live, 1, sub.request_id)     # memory: room for one more token, or a 507
        logits = await engine.decode_step(tok, tally=sub.trace.decode_experts)
    tail = ""
    if not by_stop_string:
        tail, stopped = stops.push(stream_decoder.flush())
        if stopped:
            finish_reason = "stop"
        else:
            tail += stops.flush()
    return Done(finish_reason, Usage(len(sub.prompt), n, pre.reused_tokens), text_tail=tail)


async def decode_turn(pre: Prefilled, to_admission, *, engine: Engine, new_stream_decoder, log) -> None:
    """Decode one prefilled request to its end (done, cancelled or failed), then `Finished`."""
    sub = pre.submit
    stats: dict = {"completion_tokens": 0, "first_token_at": None}

    turn = await attached(
        sub, lambda: run_decode(engine, pre, new_stream_decoder(), stats), engine=engine, log=log,
        stage="decode",
        on_shutdown=lambda: log_request(log, sub, metrics=engine.metrics, outcome="cancelled",
                                        arrived_at=pre.arrived_at, reused=pre.reused_tokens,
                                        completion_tokens=stats["completion_tokens"],
                                        first_token_at=stats["first_token_at"], error="shutdown",
                                        slot=_slot(engine)))
    first = stats["first_token_at"]
    common = dict(arrived_at=pre.arrived_at, reused=pre.reused_tokens, first_token_at=first,
                  completion_tokens=stats["completion_tokens"],
                  decode_s=(trio.current_time() - first) if first is not None else 0.0, slot=_slot(engine))
    done = turn.result
    if turn.cancelled:
        log_request(log, sub, metrics=engine.metrics, outcome="cancelled", **common)
        await end_cancelled(sub, to_admission, engine, turn.cancel_reason)
    elif turn.error is not None:
        await end_failed(sub, turn.error, to_admission, engine, log, "decode",
                         lambda: log_request(log, sub, metrics=engine.metrics, outcome="error",
                                             error=turn.error, **common), kind=turn.error_kind)
    else:
        # `finish` never waits: Done goes into the buffer if there is room, else the handler
        # reads it from `control.final` once it has drained the tokens; the channel is closed
        # either way, so a stalled client that resumes still gets its ending.
        finish(sub, done)
        await to_admission.send(Finished(sub.request_id, "done"))
        engine.announce(f"idle; {sub.request_id} done")
        log_request(log, sub, metrics=engine.metrics, outcome="done", finish_reason=done.finish_reason,
                    **common)


def _slot(engine) -> int | None:
    """The per-request log line names the slot that served it (slot mode only)."""
    return getattr(engine, "index", None)


async def decode_worker(inbox: trio.MemoryReceiveChannel, to_admission: trio.MemorySendChannel, *,
                        engine: Engine, new_stream_decoder, log, task_status=trio.TASK_STATUS_IGNORED) -> None:
    async with inbox, to_admission:
        task_status.started()
        async for pre in inbox:
            await decode_turn(pre, to_admission, engine=engine, new_stream_decoder=new_stream_decoder, log=log)
