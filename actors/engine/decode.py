"""Decode worker actor: sample, stream tokens back, feed them to the live states in batched steps.

Design notes.
 * Each prefilled request gets a task of this worker (`decode_turn`): it samples, streams the
   token and hands it to `DecodeSteps` for its sequence's next logits. `DecodeSteps.run` is the
   worker's one stepping loop: one kernel call per step for every sequence that has handed in a
   token (`decode_batch`; `decode` when there is one — the same bits), so the kernel reads each
   weight once for all of them and each sequence's logits and state are bit-identical to a decode
   of it alone (tests/native/test_decode_batch.py).
 * The step waits for every decoding sequence to hand in its token, but no longer than `gather_s`
   after the first (a client slow to read does not hold the others up); then it asks the kernel
   gate for a turn and forms the batch only once it has it: a sequence that becomes ready while a
   prefill chunk holds the gate joins this step instead of waiting for the next.
 * What a live state holds after a turn: the prompt plus every generated token but the last (the
   last one is never fed — nothing needs its logits), so `state.tokens` is exactly what the next
   turn can extend.
 * A chat reply the next turn may replay (`Submit.keep_reply`, daemon/protocol/reply_ids.py): `Done.ids`
   carries the generated ids, and when the reply ended with EOS its state (prompt + every generated
   id but that EOS) is captured as a checkpoint of kind "reply_end", memory only: the next turn, whose
   prompt holds prompt + reply (EOS included), restores it when the slot's live state is gone.
 * Cancel is per sequence and between tokens: a token not yet taken into a step is withdrawn at
   once; one in the running step waits (shielded) for that step to finish, so when the request's
   cancel is acknowledged the kernel no longer touches its state, and the other states of the step
   are not affected at all. Text is assembled as UTF-8 across token boundaries (StreamDecoder) and
   held back while it could still start a stop string (StopMatcher).
 * A draft is optional work: the memory plan's room for the plain step is reserved first (no room
   ends the request, as without drafts); the draft's extra tokens only if there is room left
   (`try_room_for`), else the step goes without it — decoding plainly, never a memory error a plain
   step would not give.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, Awaitable, Callable

import numpy as np
import trio

from .engine import Engine
from .expert_io import ExpertTally
from .kernel_gate import DECODE
from .kernel_thread import clocked
from .lifecycle import ClientGone, attached, end_cancelled, end_failed
from .messages import Done, Finished, Prefilled, Started, TokenOut, Usage
from .outcome import log_request
from ..decoding.penalties import Shaper
from .prefill import _capture
from .sequence import Sequence
from .spans import now_ns
from .replies import finish, reply
from ..decoding.sampling import choose, log_softmax, make_rng, top_logprobs
from ..decoding.speculation import DEFAULT_DRAFT_COST, Speculation, draft_cost_of
from ..decoding.stops import StopMatcher


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
    """Waits for room in the reply buffer; `ClientGone` when the handler left or stopped reading.
    With room it returns without a yield: a step handed in just before reaches the kernel before the
    HTTP handler runs (it writes the token while the kernel computes the next one)."""
    try:
        sub.reply.send_nowait(msg)
        return
    except trio.WouldBlock:
        pass
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        raise ClientGone() from None
    if not await reply(sub, msg):
        # The handler still holds its end: it is alive but has not read for replies.STALL_S.
        raise ClientGone(stalled=sub.reply.statistics().open_receive_channels > 0)


@dataclass(eq=False)
class _Step:
    """One sequence's token handed in for the next step, and what the step gave back."""
    seq: Sequence
    token: int
    done: trio.Event = field(default_factory=trio.Event)
    logits: Any = None         # [V]; [1 + len(draft), V] when the step was a speculative one
    error: BaseException | None = None
    tally: Any = None          # expert_io.ExpertTally of the request (None: not counted)
    draft: tuple = ()          # draft tokens fed after `token` in the same call (verify)
    rewind: int = 0            # tokens of the state's last verify to take back first
    ran: bool = False          # taken into a step (the kernel saw it)
    kernel_s: float = 0.0      # the step's kernel call, its own time (the kernel thread's clock)
    kernel_cpu_s: float = 0.0  # ... and the CPU the kernel thread used for it (OpenMP workers not counted)
    spans: Any = None          # the request's spans.Spans (None: not measured)
    submitted_ns: int = 0      # with spans: when it was handed in, when its step ended
    done_ns: int = 0
    draft_cost: float = DEFAULT_DRAFT_COST   # a draft token's cost in plain steps, when the step ran


PLAIN_DECAY = 0.2              # weight of the newest step in DecodeSteps.plain_s and draft_cost


def _speculative_step(kernel, states: list, rewinds: list[int], feeds: list) -> list:
    """In the kernel thread: take back what each state owes from its last verify, then one verify call
    for all of them (a sequence without a draft feeds its one token: the same bits as decode)."""
    for st, k in zip(states, rewinds):
        if k:
            kernel.rewind(st, k)
    if len(states) == 1:
        return [kernel.verify(states[0], feeds[0])]
    return kernel.verify_batch(states, feeds)


class DecodeSteps:
    """The decode worker's batched step: `step` hands a token in, `run` runs the steps."""

    def __init__(self, engine: Engine, *, gather_s: float = 0.005, speculate: bool | None = None) -> None:
        self._engine, self.gather_s = engine, gather_s
        # drafts are verified when the engine asks for it and the kernel can (verify, rewind) for this
        # model's family (Qwen3.5's supports_verify is False: no bounded rewind of its recurrent state)
        self.speculate = ((engine.speculate if speculate is None else speculate) and hasattr(engine.kernel, "verify")
                          and bool(getattr(engine.model, "supports_verify", True)))
        self._pending: list[_Step] = []
        self._arrived = trio.Event()
        self.steps = 0                          # kernel steps made (metrics, tests)
        self.inline_steps = 0                   # ... of them run in the request's own task (alone)
        self.rows = 0                           # sequence-steps they advanced
        self.verify_steps = 0                   # steps that verified a draft (tests)
        self.batched_verify_steps = 0           # ... of two or more sequences in one call
        self.drafts_dropped = 0                 # drafts not sent: no room in the memory plan
        self.plain_s: dict[int, float] = {}     # batch size -> moving average of a plain step's time
        # what one draft token adds to a step, in plain steps of its batch size (the hardware's
        # figure, shared; each request's acceptance is its own: decoding/speculation.py)
        self.draft_cost = DEFAULT_DRAFT_COST

    def submit(self, seq: Sequence, token: int, tally: Any = None, draft: tuple = (), rewind: int = 0,
               spans: Any = None) -> _Step:
        """Hand `token` in for `seq`'s next step (it does not wait), with a draft to verify after it and
        the tokens of its last verify to take back first. `tally` gets the whole step's expert-cache
        work: the experts a step reads serve every sequence in it (shared). The memory plan's check
        runs here, in the request's own task: a MemoryExceeded ends only this request. The draft goes
        only where the plan has room for it too; `entry.draft` is what is sent (() when it had none)."""
        # The step first takes back `rewind` tokens: the plain step grows the state to what plain
        # decoding's state would be plus one token (no room for that ends the request, as always).
        plain = 1 - int(rewind)
        self._engine.room_for(seq, plain)
        if draft and not self._engine.try_room_for(seq, plain + len(draft)):
            draft = ()                          # no room for the draft: this step decodes plainly
            self.drafts_dropped += 1
        entry = _Step(seq, int(token), tally=tally, draft=tuple(int(t) for t in draft), rewind=int(rewind),
                      spans=spans, submitted_ns=now_ns() if spans is not None else 0)
        self._pending.append(entry)
        if not self._maybe_alone():             # a lone one is run by its own `wait`, or `wait` wakes `run`
            self._arrived.set()
        return entry

    async def rewind(self, seq: Sequence, k: int) -> None:
        """Take back the last k tokens `seq`'s last verify fed (a request ending inside its draft)."""
        state = seq.state
        if k <= 0 or state is None:             # nothing to take back, or the state was discarded
            return
        if int(state.rewindable) < k:           # never expected: a state holding a draft is never reused
            self._engine.discard(seq)
            return
        await self._engine.run(DECODE, self._engine.kernel.rewind, state, k)

    async def wait(self, entry: _Step):
        """The logits [V] of the step `entry` was in."""
        try:
            if self._alone(entry):
                await self._run_here(entry)
                # no yield here: the request picks its next token and starts the next step before the
                # other tasks (its HTTP handler) run; a cancel that came during the call is raised now
                await trio.lowlevel.checkpoint_if_cancelled()
            else:
                if entry in self._pending:
                    self._arrived.set()         # `submit` left it to us when it could have been alone
                await entry.done.wait()
        except trio.Cancelled:
            await self.let_go(entry)
            raise
        if entry.error is not None:
            raise entry.error
        return entry.logits

    async def let_go(self, entry: _Step) -> bool:
        """The request is ending: once this returns the kernel does not touch its state for `entry`.
        Whether the step ran (False: it was withdrawn before the kernel saw it)."""
        if entry in self._pending:              # not taken into a step: withdraw it, nothing ran
            self._pending.remove(entry)
            entry.error = RuntimeError("this decode step was withdrawn: its request ended")
            entry.done.set()                    # a second let_go (wait's, then the caller's) returns at once
            return False
        with trio.CancelScope(shield=True):      # in the running step: wait until the kernel lets go
            await entry.done.wait()
        return entry.ran

    async def step(self, seq: Sequence, token: int, tally: Any = None):
        """Feed `token` to `seq`'s state in the next step; its logits [V]."""
        return await self.wait(self.submit(seq, token, tally))

    def _maybe_alone(self) -> bool:
        return len(self._pending) == 1 and self._engine.decoding() == 1

    def _alone(self, entry: _Step) -> bool:
        """`entry` is the only token handed in, its sequence the only one decoding, and the gate is free:
        the step `run` would make is exactly [entry], at once (no gather wait, no gate wait)."""
        return (len(self._pending) == 1 and self._pending[0] is entry and self._engine.decoding() == 1
                and self._engine.gate.free)

    async def _run_here(self, entry: _Step) -> None:
        """`run`'s step for a lone sequence, in its own task: the kernel starts without waking the
        stepping task first, and the request's task resumes from the call itself (no event). A cancel
        before the gate is taken withdraws the step (nothing ran); after, the step runs to its end."""
        self._pending.remove(entry)
        try:
            async with self._engine.gate.hold(DECODE):
                await self._run_step([entry])
        finally:
            if not entry.done.is_set():         # cancelled before the kernel saw it
                entry.error = RuntimeError("this decode step was withdrawn: its request ended")
                entry.done.set()
        self.inline_steps += 1

    async def _wait_arrival(self) -> None:
        self._arrived = trio.Event()
        await self._arrived.wait()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        engine = self._engine
        task_status.started()
        while True:
            while not self._pending:
                await self._wait_arrival()
            with trio.move_on_after(self.gather_s):
                while len(self._pending) < engine.decoding():
                    await self._wait_arrival()
            async with engine.gate.hold(DECODE):
                # The batch is formed now, with the gate held: tokens handed in while a prefill chunk
                # had the kernel join this step (a batch formed before the wait would leave them out).
                batch, self._pending = self._pending, []
                if batch:
                    await self._run_step(batch)

    def _timed(self, rows: int, drafted: int, call_s: float) -> None:
        """A step of `rows` sequences that fed `drafted` draft tokens took call_s: a step without
        drafts is a plain one (a rewind costs next to nothing); one with drafts measures draft_cost."""
        plain = self.plain_s.get(rows)
        if not drafted:
            self.plain_s[rows] = call_s if plain is None else (1 - PLAIN_DECAY) * plain + PLAIN_DECAY * call_s
        elif plain is not None:
            c = draft_cost_of(call_s, plain, drafted)
            self.draft_cost = (1 - PLAIN_DECAY) * self.draft_cost + PLAIN_DECAY * c

    async def _run_step(self, batch: list[_Step]) -> None:
        engine = self._engine
        kernel = engine.kernel
        try:
            step_io = ExpertTally()
            speculative = any(e.draft or e.rewind for e in batch)
            spent: list[tuple[int, int, int]] = []   # the call's (start, end, CPU) ns in the kernel thread
            measured = [e for e in batch if e.spans is not None]
            start_ns = now_ns() if measured else 0
            for e in batch:
                e.ran = True
                if e.spans is not None:
                    e.spans.add("to_step", start_ns - e.submitted_ns)
            t0 = trio.current_time()
            if speculative:
                feeds = [np.array((e.token, *e.draft), dtype=np.int32) for e in batch]
                out = await engine.runner.run(clocked(_speculative_step, spent), kernel, [e.seq.state for e in batch],
                                              [e.rewind for e in batch], feeds, tally=step_io)
            elif len(batch) == 1:               # one sequence: the kernel's single-state step, the same bits
                e = batch[0]
                out = [await engine.runner.decode(kernel, e.seq.state, e.token, spent, tally=step_io)]
            else:
                out = await engine.runner.run(clocked(kernel.decode_batch, spent), [e.seq.state for e in batch],
                                              [e.token for e in batch], tally=step_io)
            self._timed(len(batch), sum(len(e.draft) for e in batch), trio.current_time() - t0)
            kernel_s = (spent[0][1] - spent[0][0]) / 1e9 if spent else 0.0
            kernel_cpu_s = spent[0][2] / 1e9 if spent else 0.0
            if measured:
                back_ns = now_ns()
                hop = back_ns - start_ns - int(kernel_s * 1e9)
                for e in measured:
                    if spent:                   # to the thread (the call starting), and back (resumed)
                        e.spans.add("hop_in", spent[0][0] - start_ns)
                        e.spans.add("hop_out", back_ns - spent[0][1])
            for e in batch:
                e.kernel_s, e.kernel_cpu_s = kernel_s, kernel_cpu_s
                e.draft_cost = self.draft_cost
                if e.tally is not None:
                    e.tally.add(step_io.io)
            self.steps += 1
            self.rows += len(batch)
            drafted = any(e.draft for e in batch)
            self.verify_steps += drafted
            self.batched_verify_steps += drafted and len(batch) > 1
            if engine.metrics is not None:
                engine.metrics.decode_steps.inc()
                engine.metrics.decode_step_rows.inc(len(batch))
                if drafted and len(batch) > 1:
                    engine.metrics.spec_batched_verify_steps.inc()
            for i, e in enumerate(batch):
                e.logits = out[i]
            if measured:
                after_ns = now_ns()
                for e in measured:
                    e.spans.add("after", after_ns - start_ns - hop - int(kernel_s * 1e9))
        except Exception as exc:                # every sequence of the step fails (its state may be torn)
            for e in batch:
                e.error = exc
                engine.discard(e.seq)           # never reused, whatever its request does next
        finally:
            for e in batch:
                if e.logits is None and e.error is None:
                    e.error = RuntimeError("the engine stopped before this decode step finished")
                if e.spans is not None:
                    e.done_ns = now_ns()
                e.done.set()


@dataclass(frozen=True)
class Feed:
    """How a request's decode loop feeds its tokens to its sequence (DecodeSteps, or a test's)."""
    submit: Callable[..., Any]                 # (token, tally, draft, rewind) -> a handle; does not wait
    wait: Callable[[Any], Awaitable[Any]]      # handle -> next-token logits ([1 + len(draft), V] with a draft)
    let_go: Callable[[Any], Awaitable[bool]]   # handle -> once the kernel no longer uses it; whether it ran
    rewind: Callable[[int], Awaitable[None]] | None = None   # take back k tokens of the last verify
    speculative: bool = False                  # the kernel verifies drafts (verify, rewind)


def feed_of(steps: DecodeSteps, seq: Sequence, spans: Any = None) -> Feed:
    return Feed(lambda tok, tally, draft=(), rewind=0: steps.submit(seq, tok, tally, draft, rewind, spans),
                steps.wait, steps.let_go, lambda k: steps.rewind(seq, k), speculative=steps.speculate)


def _grammar_prefix(constraint, draft: list[int]) -> list[int]:
    """The part of a draft the request's grammar allows from here: a forbidden token ends it."""
    if constraint is None or not draft:
        return draft
    return draft[:constraint.allowed_prefix(draft)]


async def run_decode(engine: Engine, pre: Prefilled, stream_decoder, stats: dict, feed: Feed) -> Done:
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
    metrics = getattr(engine, "metrics", None)
    # Speculation (actors/decoding/speculation.py): `ahead` holds the draft tokens the last verify fed that are
    # not picked yet, each with the logits after it; `owed` counts fed tokens the reply did not keep,
    # taken back with the next kernel call or when the turn ends.
    spec = None
    if feed.speculative and budget > 1:     # a long prompt's lookup is built off the event loop
        spec = (Speculation.over(sub.prompt) if len(sub.prompt) <= 4096
                else await trio.to_thread.run_sync(Speculation.over, sub.prompt))
    ahead: list[tuple[int, Any]] = []
    owed = 0
    generated: list[int] = []     # every picked token (Done.ids, when the request keeps them)
    verified: tuple[int, float] | None = None   # (drafted, draft_cost) of the open draft
    accepted = 0
    sp = sub.trace.spans                        # spans.Spans, or None (not measured)

    def close_draft() -> None:
        nonlocal verified, accepted
        if verified is not None:
            drafted, draft_cost = verified
            spec.record(drafted, accepted, draft_cost)
            if metrics is not None:
                metrics.spec_drafts.inc()
                metrics.spec_draft_tokens.inc(drafted)
                metrics.spec_accepted_tokens.inc(accepted)
        verified, accepted = None, 0

    try:
        if sp is not None:
            sp.lap()
        while n < budget:
            allowed = None
            if s.constraint is not None:  # the grammar mask, off the event loop (llguidance drops the GIL)
                allowed = await trio.to_thread.run_sync(s.constraint.allowed)
            if off_loop:   # never abandoned: the thread owns `rng` until it returns (it is bounded)
                tok, lp, top = await trio.to_thread.run_sync(_pick, logits, shaper, allowed, s, rng)
            else:
                tok, lp, top = _pick(logits, shaper, allowed, s, rng)
            if sp is not None:
                sp.lap("pick")
            shaper.accept(tok)
            generated.append(tok)
            n += 1
            stats["completion_tokens"] = n
            if metrics is not None:
                metrics.decode_tokens.inc()
            if n == 1:
                stats["first_token_at"] = trio.current_time()
            kept = bool(ahead) and tok == ahead[0][0]   # the draft guessed it: it is fed already
            if kept:
                _, after = ahead.pop(0)
                accepted += 1
            else:
                owed += len(ahead)
                ahead = []
            if spec is not None:
                spec.push(tok)
                if not ahead:
                    close_draft()
            if tok == eos and not s.ignore_eos:
                finish_reason = "stop"
                owed += kept             # the last token is never fed (below): a drafted one is taken back
                break
            text, stopped = stops.push(stream_decoder.push(tok), stream_decoder.hidden_text(tok))
            if sp is not None:
                sp.lap("text")
            if stopped or n == budget:   # the last token is never fed: nothing needs its logits
                owed += kept
                await _send(sub, TokenOut(tok, text, lp, top))
                if stopped:
                    finish_reason, by_stop_string = "stop", True
                break
            if kept:
                await _send(sub, TokenOut(tok, text, lp, top))
                if sp is not None:
                    sp.lap("reply")
                logits = after
                continue
            draft = _grammar_prefix(s.constraint, spec.draft(budget - n - 1)) if spec is not None else []
            # Hand the token in before sending it: the kernel computes the next logits while this token
            # goes out to the client.
            if spec is not None:
                fed = feed.submit(tok, sub.trace.decode_experts, draft, owed)
                if len(fed.draft) < len(draft):      # no room in the memory plan: sent without it
                    spec.stats["no_room"] += 1
                    draft = list(fed.draft)
            else:
                fed = feed.submit(tok, sub.trace.decode_experts)
            if sp is not None:
                sp.lap("submit")
            try:
                await _send(sub, TokenOut(tok, text, lp, top))
                if sp is not None:
                    sp.lap("reply")
                out = await feed.wait(fed)
            except BaseException:                   # client gone, cancelled, or the step failed: it ends first
                if await feed.let_go(fed):
                    owed = len(draft)               # what was owed went with the step; its draft is owed now
                raise
            owed = 0
            sub.trace.decode_kernel_s += getattr(fed, "kernel_s", 0.0)
            sub.trace.decode_kernel_cpu_s += getattr(fed, "kernel_cpu_s", 0.0)
            if sp is not None:
                sp.add("wake", now_ns() - fed.done_ns)
                sp.lap()
            if spec is not None:
                spec.stats["calls"] += 1
            if draft:
                logits, ahead = out[0], list(zip(draft, out[1:]))
                verified = (len(draft), fed.draft_cost)
            else:
                logits = out if out.ndim == 1 else out[0]
    finally:
        owed += len(ahead)
        if spec is not None:
            close_draft()
            stats["speculation"] = spec.stats
        if owed and feed.rewind is not None:
            # The live state keeps exactly the reply's fed tokens, so the next turn can extend it.
            with trio.CancelScope(shield=True):
                await feed.rewind(owed)
    tail = ""
    if not by_stop_string:
        tail, stopped = stops.push(stream_decoder.flush())
        if stopped:
            finish_reason = "stop"
        else:
            tail += stops.flush()
    return Done(finish_reason, Usage(len(sub.prompt), n, pre.reused_tokens), text_tail=tail,
                stop_sequence=stops.matched, ids=tuple(generated) if sub.keep_reply else ())


async def capture_reply_end(engine: Engine, seq: Sequence, sub, done: Done) -> None:
    """A reply that ended with EOS: snapshot its state (prompt + reply but that EOS, which is never fed)
    as a "reply_end" checkpoint, under the usual capture rules (budget, memory plan, min_tokens)."""
    ck = engine.checkpoints
    eos = getattr(engine.tokenizer, "eos_id", None)
    state = seq.state
    if (not ck.enabled or not done.ids or done.ids[-1] != eos or done.finish_reason != "stop"
            or done.stop_sequence is not None or state is None):
        return
    tokens = np.asarray(sub.prompt + done.ids[:-1], dtype=np.int32)
    if tokens.shape[0] < ck.min_tokens or int(state.n_tokens) != tokens.shape[0]:
        return
    if ck.store.contains(tokens):
        return
    await _capture(engine, seq, state, tokens, "reply_end", sub, priority=DECODE)


async def decode_turn(pre: Prefilled, seq: Sequence, to_admission, *, engine: Engine, steps: DecodeSteps,
                      new_stream_decoder, log) -> None:
    """Decode one prefilled request to its end (done, cancelled or failed), then free its slot and
    send `Finished`."""
    sub = pre.submit
    stats: dict = {"completion_tokens": 0, "first_token_at": None}

    async def work() -> Done:
        done = await run_decode(engine, pre, new_stream_decoder(), stats, feed_of(steps, seq, sub.trace.spans))
        if sub.keep_reply:
            await capture_reply_end(engine, seq, sub, done)
        return done

    turn = await attached(
        sub, work, engine=engine, seq=seq, log=log,
        stage="decode",
        on_shutdown=lambda: log_request(log, sub, metrics=engine.metrics, outcome="cancelled",
                                        arrived_at=pre.arrived_at, reused=pre.reused_tokens,
                                        completion_tokens=stats["completion_tokens"],
                                        first_token_at=stats["first_token_at"], error="shutdown",
                                        slot=seq.index))
    first = stats["first_token_at"]
    common = dict(arrived_at=pre.arrived_at, reused=pre.reused_tokens, first_token_at=first,
                  completion_tokens=stats["completion_tokens"],
                  decode_s=(trio.current_time() - first) if first is not None else 0.0, slot=seq.index,
                  speculation=stats.get("speculation"))
    done = turn.result
    if turn.cancelled:
        log_request(log, sub, metrics=engine.metrics, outcome="cancelled", **common)
        await end_cancelled(sub, seq, to_admission, engine, turn.cancel_reason)
    elif turn.error is not None:
        await end_failed(sub, seq, turn.error, to_admission, engine, log, "decode",
                         lambda: log_request(log, sub, metrics=engine.metrics, outcome="error",
                                             error=turn.error, **common), kind=turn.error_kind)
    else:
        # `finish` never waits: Done goes into the buffer if there is room, else the handler
        # reads it from `control.final` once it has drained the tokens; the channel is closed
        # either way, so a stalled client that resumes still gets its ending.
        finish(sub, done)
        engine.release(seq)
        await to_admission.send(Finished(sub.request_id, "done"))
        engine.announce(f"idle; {sub.request_id} done")
        log_request(log, sub, metrics=engine.metrics, outcome="done", finish_reason=done.finish_reason,
                    **common)


async def decode_worker(inbox: trio.MemoryReceiveChannel, to_admission: trio.MemorySendChannel, *,
                        engine: Engine, new_stream_decoder, log, steps: DecodeSteps | None = None,
                        task_status=trio.TASK_STATUS_IGNORED) -> None:
    steps = steps if steps is not None else DecodeSteps(engine)
    async with inbox, to_admission, trio.open_nursery() as nursery:
        await nursery.start(steps.run)
        task_status.started()
        async for pre in inbox:
            nursery.start_soon(partial(decode_turn, pre, engine.slots[pre.slot], to_admission, engine=engine,
                                       steps=steps, new_stream_decoder=new_stream_decoder, log=log))
        nursery.cancel_scope.cancel()   # the inbox closed: the engine is stopping
