"""Prefill worker actor: for each admitted request, a slot (slot_policy.py), a plan (reuse the slot's
live state, restore a checkpoint, or start fresh), then the prompt's pieces in the kernel thread,
snapshotting at the plan's capture points; then `Prefilled` to the decode worker.

Design notes. The plan (plan.py) and the checkpoint index (store.py) are pure; their effects live in
actors/checkpoints/ (Checkpoints). The prompt runs as kernel calls (plan.pieces) of at most `Engine.piece_tokens`
tokens that end at every capture point, so a capture never recomputes anything; the kernel chunks
each call itself, and its results do not depend on where calls or chunks start. With one slot a
call is a segment (one log line each); with several it is one chunk, and every prefilling
sequence asks the kernel gate for its next chunk at the priority of its tokens left, so the
sequences advance one chunk at a time, shortest remaining first, between decode steps.

Each request runs in its own task under its own cancel scope (attached through its
RequestControl), which covers its whole prefill; each call is abortable, so a cancel stops the
kernel at the next chunk boundary and the state keeps every completed chunk — an identical retry
extends it and resumes there. The request's slot is freed and `Finished` goes to admission only
after the kernel call has returned, which is what lets admission hold the slot until the state is
consistent.
"""

from __future__ import annotations

from contextlib import ExitStack

import numpy as np
import trio

from .engine import Engine
from .expert_io import ExpertIO, ExpertTally
from .kernel_gate import prefill_priority
from .lifecycle import attached, end_cancelled, end_failed
from .messages import Admitted, Prefilled, PromptLogprobs
from .outcome import log_request
from .progress import ProgressReporter
from ..decoding.sampling import log_softmax, top_logprobs
from ..checkpoints.plan import pieces
from .sequence import Sequence

ALL_LOGITS_BUDGET = 1 << 26   # floats of [n, V] logits one segment may return (256 MiB) with all_logits
MAX_RESTORE_ATTEMPTS = 4      # checkpoints tried (bad or without room) before the request prefills without one


def segment_length(segment: int, chunk: int, vocab_size: int, all_logits: bool) -> int:
    """Tokens per kernel call. With every position's logits, shorter so [n, V] stays bounded."""
    if not all_logits:
        return segment
    return max(chunk, min(segment, ALL_LOGITS_BUDGET // max(vocab_size, 1) // chunk * chunk))


class PrefillError(RuntimeError):
    pass


def _segment_experts(io: ExpertIO, seconds: float) -> dict:
    """The expert-cache fields of a segment's log line (none when no expert was paged): the
    stall fraction is the share of the segment's time the compute waited for reads."""
    if io.lookups == 0:
        return {}
    return {"experts": {**io.as_log(), "stall_frac": round(io.stall_s / max(seconds, 1e-9), 4)}}


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
    # A copy of the one row kept: a view would keep the whole [n_done, V] block (up to 256 MiB) alive
    # for as long as the request holds its logits (Prefilled, the next segment's prev_row).
    return n_done, (rows[n_done - 1].copy() if n_done else prev_row), lps, tops


async def _prepare(engine: Engine, seq: Sequence, submit, ids: np.ndarray, log):
    """Plan, then bring the slot's live state to the plan's start: reuse it, restore a checkpoint (reading
    a disk-only one first) or make a fresh one. A checkpoint that turns out bad is dropped with a
    warning, and one the memory plan has no room to bring in is skipped; either way the request is
    planned again without it (a shorter checkpoint, the live state, or fresh): a restore that cannot be
    done never fails the request, it only costs the prefill of those tokens."""
    ck = engine.checkpoints
    await ck.refresh_before_plan()   # a shared disk tier: a fresh listing if the mount answers at once
    no_room: frozenset[str] = frozenset()   # checkpoints the memory plan had no room to bring in now
    failed: frozenset[str] = frozenset()    # checkpoints whose restore failed (read, kernel, tokens)
    for attempt in range(MAX_RESTORE_ATTEMPTS + 1):
        live = seq.state
        live_tokens = None
        if live is not None and seq.figures.has_logits:
            live_tokens = np.asarray(live.tokens, dtype=np.int32)
        # Each try excludes one more checkpoint; after MAX_RESTORE_ATTEMPTS failed ones (other slots may
        # keep capturing new prefixes) none is tried any more, so the last plan is the live state or fresh.
        exclude = no_room | failed
        if attempt == MAX_RESTORE_ATTEMPTS:
            exclude |= {e.id for e in ck.store.prefixes_of(ids)}
        plan = ck.plan(ids, live_tokens, hint_tokens=submit.hint_tokens, turn_tokens=submit.turn_tokens,
                       need_all_logits=submit.prompt_logprobs, turn_end_tokens=submit.turn_end_tokens,
                       exclude=exclude)
        if plan.action == "reuse_live":
            ck.note_plan(plan, ids, submit.request_id)
            return plan, live
        if plan.action == "fresh":
            ck.note_plan(plan, ids, submit.request_id)
            return plan, engine.new_state(seq)
        entry = ck.store.get(plan.restore_id)
        need = 0 if entry is None else engine.restore_bytes(entry)
        # The read (disk), the rebuilt snapshot and the new live state all exist before the guard counts
        # them as a checkpoint and a state: room for them is held first, or the restore is not tried.
        with ExitStack() as held:
            room = held.enter_context(engine.hold_room(need, submit.request_id, spare=(plan.restore_id,)))
            if not room and seq.state is not None:
                # the live state the checkpoint would replace: its memory goes first, then ask again
                engine.discard(seq)
                room = held.enter_context(engine.hold_room(need, submit.request_id, spare=(plan.restore_id,)))
            if not room:
                log.info("checkpoint_restore_skipped", request_id=submit.request_id, id=plan.restore_id,
                         tokens=plan.start, bytes=need, reason="no room in the memory plan to bring it in")
                no_room |= {plan.restore_id}
                continue
            failed |= {plan.restore_id}   # until it is this slot's live state below
            snap, tier = await ck.snapshot_for(plan.restore_id, submit.request_id)
            if snap is None:
                continue
            try:
                state = await engine.run(prefill_priority(seq.tokens_left()), engine.kernel.State.restore,
                                         engine.model, snap)
            except ValueError as e:   # KernelError: the kernel refused the snapshot (model, page layout)
                entry = ck.store.get(plan.restore_id)
                if entry is not None:
                    await ck.drop_bad(entry, f"kernel refused the snapshot: {e}", submit.request_id)
                continue
            if not await ck.check_restored(plan.restore_id, state.tokens, ids[:plan.start], submit.request_id):
                continue   # a planted or stale file: never let it change the answer
            seq.state = state
        ck.note_plan(plan, ids, submit.request_id)
        ck.hit(plan.restore_id, tier, submit.request_id, len(ids))
        return plan, state
    raise AssertionError("unreachable: the last plan restores nothing")


def _reuse_source(engine: Engine, plan) -> dict:
    """Where the plan's reused tokens come from: the live state, a checkpoint (its id and kind), or nothing."""
    if plan.action == "reuse_live":
        return {"from": "live_state", "tokens": plan.start}
    if plan.action == "restore":
        entry = engine.checkpoints.store.get(plan.restore_id)
        return {"from": "checkpoint", "id": plan.restore_id, "kind": None if entry is None else entry.kind,
                "tokens": plan.start}
    return {"from": "none", "tokens": 0}


def _snapshot(state, share_pages: bool):
    return state.snapshot(share_pages=share_pages)


async def _capture(engine: Engine, seq: Sequence, state, ids: np.ndarray, kind: str, submit,
                   priority: tuple[int, int] | None = None) -> None:
    """Snapshot the state where it is now (in the kernel thread; it releases the GIL) and store it;
    not at all when the store could not keep it or the memory plan has no room for the copy. A snapshot
    copies the state's tail and shares its page groups (the state copies a shared group before writing it).
    `priority`: the kernel gate's (a prefill's by its tokens left, unless given)."""
    nbytes, why = engine.capture_refusal(seq, kind)
    if why is not None:
        engine.checkpoints.skip_capture(ids, kind, nbytes, why, submit.request_id)
        return
    t0 = trio.current_time()
    if priority is None:
        priority = prefill_priority(len(submit.prompt) - len(ids))
    snap = await engine.run(priority, _snapshot, state, engine.checkpoints.share_pages)
    engine.checkpoints.capture(ids, kind, snap, submit.request_id)
    submit.trace.snapshot_s += trio.current_time() - t0
    submit.trace.snapshots += 1


async def run_prefill(engine: Engine, seq: Sequence, submit, log, progress: dict | None = None
                      ) -> tuple[np.ndarray, int, PromptLogprobs | None]:
    """Prefill `submit.prompt` into `seq`'s live state. Returns (next-token logits [V], reused, prompt logprobs).
    `reused` counts the prompt tokens not computed: from the live state or from a restored checkpoint.
    `progress["reused"]` is set as soon as it is known (for the log line of a cancelled prefill)."""
    trace = submit.trace
    t_plan = trace.prefill_at = trio.current_time()
    ids = np.asarray(submit.prompt, dtype=np.int32)
    n = int(ids.shape[0])
    plan, state = await _prepare(engine, seq, submit, ids, log)
    trace.planned_at = trio.current_time()
    reused = plan.start
    trace.reuse = _reuse_source(engine, plan)
    if progress is not None:
        progress["reused"] = reused
    log.info("prefill_plan", request_id=submit.request_id, prompt_tokens=n, reused_tokens=reused,
             fresh=plan.action == "fresh", action=plan.action, plan=plan.describe(),
             captures=[f"{c.kind}@{c.position}" for c in plan.captures] + (
                 [f"prompt_end@{n}"] if plan.capture_prompt_end else []),
             skipped=list(plan.skipped), restore_ms=round((trio.current_time() - t_plan) * 1000, 2))
    if engine.metrics is not None and plan.action == "reuse_live":
        engine.metrics.prefill_tokens.inc(reused, kind="reused")

    k = submit.sampling.top_logprobs if submit.prompt_logprobs else 0
    lps: list = []
    tops: list = []
    prev_row = None
    logits = None
    cut_kind = {c.position: c.kind for c in plan.captures}
    t_begin = trio.current_time()
    # Client-visible progress (SSE `: progress` comments, /v1/status; actors/engine/progress.py): keep begin()
    # before the first kernel call and segment_done() after each call, whatever the plan's start.
    reporter = ProgressReporter(submit, n, reused, min_interval_s=engine.progress_interval_s)
    if reused < n:
        reporter.begin()
    seg_len = segment_length(engine.piece_tokens, engine.chunk, int(engine.model.vocab_size), submit.prompt_logprobs)
    # The log: a line per segment at info, per kernel call at debug (with several slots a call is one chunk)
    span_from, span_t0, span_io = plan.start, t_begin, ExpertTally()
    for a, b in pieces(plan.start, n, seg_len, cut_kind):  # one kernel call each
        seg = ids[a:b]
        t0 = trio.current_time()
        seg_io = ExpertTally()     # this segment's expert-cache work (paged experts; actors/engine/expert_io.py)
        engine.room_for(seq, len(seg))   # memory: room for len(seg) more tokens, or a 507 (memory_guard.py)
        priority = prefill_priority(n - a)   # shortest remaining first (kernel_gate.py)
        try:
            if submit.prompt_logprobs:
                n_done, logits, seg_lps, seg_tops = await engine.run(
                    priority, _prefill_with_logprobs, engine.kernel, state, seg, prev_row, k, chunk=engine.chunk,
                    abortable=True, tally=seg_io)
                lps += seg_lps
                tops += seg_tops
                prev_row = logits
            else:
                n_done, logits = await engine.run(priority, engine.kernel.prefill, state, seg, chunk=engine.chunk,
                                                  abortable=True, tally=seg_io)
        finally:
            trace.prefill_experts.add(seg_io.io)
        now = trio.current_time()
        trace.kernel_s += now - t0
        trace.kernel_calls += 1
        done = a + n_done - plan.start
        if engine.metrics is not None:
            engine.metrics.prefill_tokens.inc(n_done, kind="computed")
        rate = done / max(now - t_begin, 1e-9)
        eta_s = round((n - a - n_done) / rate, 2) if rate > 0 else None
        span_io.add(seg_io.io)
        if a + n_done - span_from >= engine.segment or a + n_done >= n or n_done < len(seg):
            log.info("prefill_segment", request_id=submit.request_id, tokens_done=a + n_done, tokens_total=n,
                     tok_s=round((a + n_done - span_from) / max(now - span_t0, 1e-9), 1), eta_s=eta_s,
                     **_segment_experts(span_io.io, now - span_t0))
            span_from, span_t0, span_io = a + n_done, now, ExpertTally()
        else:
            log.debug("prefill_chunk", request_id=submit.request_id, tokens_done=a + n_done, tokens_total=n,
                      tok_s=round(n_done / max(now - t0, 1e-9), 1), eta_s=eta_s,
                      **_segment_experts(seg_io.io, now - t0))
        reporter.segment_done(a + n_done)
        engine.announce(f"prefill {submit.request_id}: {a + n_done}/{n} tokens"
                        + (f", ETA {(n - a - n_done) / rate:.0f} s" if rate > 0 and a + n_done < n else ""))
        if n_done < len(seg):
            # Only an abort stops the kernel early; the cancel itself arrives at the next checkpoint.
            await trio.lowlevel.checkpoint()
            raise PrefillError(f"kernel stopped after {n_done} of {len(seg)} tokens without a cancel")
        if b in cut_kind:
            await _capture(engine, seq, state, ids[:b], cut_kind[b], submit)
    if plan.capture_prompt_end:
        await _capture(engine, seq, state, ids, "prompt_end", submit)
    if logits is None:
        logits = state.last_logits
    prompt_lp = PromptLogprobs(tuple(lps), tuple(tops)) if submit.prompt_logprobs else None
    trace.prefilled_at = trio.current_time()
    return np.asarray(logits), reused, prompt_lp


async def prefill_turn(adm: Admitted, seq: Sequence, to_admission, *, engine: Engine, log) -> Prefilled | None:
    """Prefill one admitted request into `seq`. Its `Prefilled` for the decode worker, or None when
    the request has ended here (cancelled or failed; slot freed, `Finished` sent)."""
    sub = adm.submit
    progress: dict = {}

    def log_outcome(outcome: str, error: str | None = None) -> None:
        log_request(log, sub, metrics=engine.metrics, outcome=outcome, arrived_at=adm.arrived_at,
                    reused=progress.get("reused", 0) if outcome == "cancelled" else 0, error=error, slot=seq.index)

    turn = await attached(sub, lambda: run_prefill(engine, seq, sub, log, progress), engine=engine, seq=seq,
                          log=log, stage="prefill", on_shutdown=lambda: log_outcome("cancelled", "shutdown"))
    if turn.cancelled:
        log_outcome("cancelled")
        log.info("prefill_cancelled", request_id=sub.request_id,
                 state_tokens=seq.figures.n_tokens)
        await end_cancelled(sub, seq, to_admission, engine, turn.cancel_reason)
        return None
    if turn.error is not None:
        await end_failed(sub, seq, turn.error, to_admission, engine, log, "prefill",
                         lambda: log_outcome("error", turn.error), kind=turn.error_kind)
        return None
    logits, reused, prompt_lp = turn.result
    return Prefilled(sub, logits, reused, prompt_lp, adm.arrived_at, slot=seq.index)


async def prefill_worker(inbox: trio.MemoryReceiveChannel, to_decode: trio.MemorySendChannel,
                         to_admission: trio.MemorySendChannel, *, engine: Engine, log,
                         task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Admission admits at most one request per slot, so a slot is always free here; each request's
    prefill is a task of this worker (its own cancel scope), and its sequence enters the decode
    phase before `Prefilled` goes out (so the next decode step counts it)."""

    async def serve(adm: Admitted, seq: Sequence) -> None:
        pre = await prefill_turn(adm, seq, to_admission, engine=engine, log=log)
        if pre is not None:
            engine.set_phase(seq, "decode")
            to_decode.send_nowait(pre)   # room for one per slot: never waits, never lost

    async with inbox, to_decode, to_admission, trio.open_nursery() as nursery:
        task_status.started()
        async for adm in inbox:
            seq, shared = engine.assign(adm.submit.request_id, adm.submit.prompt)
            log.info("slot_assigned", request_id=adm.submit.request_id, slot=seq.index, shared_tokens=shared)
            nursery.start_soon(serve, adm, seq)
        nursery.cancel_scope.cancel()   # the inbox closed: the engine is stopping
