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
from .lifecycle import attached, end_cancelled, end_failed
from .messages import Done, Finished, Prefilled, Started, TokenOut, Usage
from .outcome import log_request
from .penalties import Shaper
from .replies import reply
from .sampling import choose, log_softmax, make_rng, top_logprobs
from .stops import StopMatcher


class ClientGone(Exception):
    pass


async def run_decode(engine: Engine, pre: Prefilled, stream_decoder, stats: dict) -> Done:
    sub = pre.submit
    s = sub.sampling
    rng = make_rng(s.seed)
    stops = StopMatcher(s.stop)
    eos = getattr(engine.tokenizer, "eos_id", None)
    budget = max(0, min(s.max_tokens, engine.context_length - len(sub.prompt)))
    if not await reply(sub, Started(pre.reused_tokens, pre.prompt_logprobs)):
        raise ClientGone
    logits = pre.logits
    n = 0
    finish = "length"
    by_stop_string = False
    shaper = Shaper(s, len(logits))
    while n < budget:
        allowed = None
        if s.constraint is not None:  # the grammar mask, off the event loop (llguidance drops the GIL)
            allowed = await trio.to_thread.run_sync(s.constraint.allowed)
        tok = choose(shaper.shape(logits, allowed), s, rng)
        shaper.accept(tok)
        n += 1
        stats["completion_tokens"] = n
        if n == 1:
            stats["first_token_at"] = trio.current_time()
        if tok == eos and not s.ignore_eos:
            finish = "stop"
            break
        lp, top = 0.0, ()
        if s.logprobs:
            row = log_softmax(logits)
            lp, top = float(row[tok]), top_logprobs(row, s.top_logprobs)
        text, stopped = stops.push(stream_decoder.push(tok))
        if not await reply(sub, TokenOut(tok, text, lp, top)):
            raise ClientGone
        if stopped:
            finish, by_stop_string = "stop", True
            break
        if n == budget:
            break
        logits = await engine.runner.run(engine.kernel.decode, engine.live, tok)
    tail = ""
    if not by_stop_string:
        tail, stopped = stops.push(stream_decoder.flush())
        if stopped:
            finish = "stop"
        else:
            tail += stops.flush()
    return Done(finish, Usage(len(sub.prompt), n, pre.reused_tokens), text_tail=tail)


async def decode_worker(inbox: trio.MemoryReceiveChannel, to_admission: trio.MemorySendChannel, *,
                        engine: Engine, new_stream_decoder, log, task_status=trio.TASK_STATUS_IGNORED) -> None:
    async with inbox, to_admission:
        task_status.started()
        async for pre in inbox:
            pre: Prefilled
            sub = pre.submit
            stats: dict = {"completion_tokens": 0, "first_token_at": None}

            turn = await attached(
                sub, lambda: run_decode(engine, pre, new_stream_decoder(), stats), engine=engine, log=log,
                stage="decode", gone=(ClientGone,),
                on_shutdown=lambda: log_request(log, sub, metrics=engine.metrics, outcome="cancelled",
                                                arrived_at=pre.arrived_at, reused=pre.reused_tokens,
                                                completion_tokens=stats["completion_tokens"],
                                                first_token_at=stats["first_token_at"], error="shutdown"))
            first = stats["first_token_at"]
            common = dict(arrived_at=pre.arrived_at, reused=pre.reused_tokens, first_token_at=first,
                          completion_tokens=stats["completion_tokens"],
                          decode_s=(trio.current_time() - first) if first is not None else 0.0)
            done = turn.result
            if turn.cancelled:
                log_request(log, sub, metrics=engine.metrics, outcome="cancelled", **common)
                await end_cancelled(sub, to_admission, engine)
            elif turn.error is not None:
                await end_failed(sub, turn.error, to_admission, engine, log, "decode",
                                 lambda: log_request(log, sub, metrics=engine.metrics, outcome="error",
                                                     error=turn.error, **common))
            else:
                # Free the engine before the (possibly slow) final reply: the state is consistent now.
                await to_admission.send(Finished(sub.request_id, "done"))
                engine.announce(f"idle; {sub.request_id} done")
                log_request(log, sub, metrics=engine.metrics, outcome="done", finish_reason=done.finish_reason,
                            **common)
                await reply(sub, done)
