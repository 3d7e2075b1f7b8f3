"""A lone decoding sequence runs its steps in its own task (issue 41 §5: the daemon's per-token path).

`DecodeSteps.wait` runs the step itself when the token is the only one handed in, its sequence the
only one decoding and the kernel gate free: the kernel starts without waking the stepping task, on
the one kernel thread (actors/engine/call_thread.py), and the token went into the reply buffer first without
a yield. These tests check that the path runs (counters), that it gives the tokens and state a plain
greedy decode gives, and that it keeps the gate's policy: a prefill that asks for the kernel during a
step gets it next, before the stream's following step (the decode step hands the gate over at once).
"""

from __future__ import annotations

import types

import numpy as np
import trio
import trio.testing

import fake_kernel
from decode_doubles import TagText as _Text, sent_tokens as _sent
from gated_kernel import Gate, GatedKernel
from cairn.actors.engine import decode
from cairn.actors.engine.engine import Engine
from cairn.actors.engine.kernel_gate import DECODE, prefill_priority
from cairn.actors.engine.messages import Prefilled, RequestControl, Sampling, Submit
from cairn.actors.engine.sequence import Sequence

V = 64
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
GREEDY = Sampling(max_tokens=24, temperature=0, ignore_eos=True)


def _greedy_alone(model, n: int) -> tuple[list[int], list[int]]:
    """The reply and the state's tokens of a plain greedy decode, straight on the fake kernel."""
    st = fake_kernel.State(model)
    _, logits = fake_kernel.prefill(st, np.asarray(PROMPT, dtype=np.int32))
    out = []
    for i in range(n):
        tok = int(np.argmax(logits))
        out.append(tok)
        if i < n - 1:                   # the last token is never fed
            logits = fake_kernel.decode(st, tok)
    return out, [int(t) for t in st.tokens]


async def _prefilled(engine: Engine, sampling: Sampling):
    seq = engine.slots[0]
    seq.request_id, seq.phase = "r0", "decode"
    engine.new_state(seq)
    _, logits = await engine.run(DECODE, engine.kernel.prefill, seq.state, np.asarray(PROMPT, dtype=np.int32))
    send, recv = trio.open_memory_channel(1000)
    sub = Submit("r0", tuple(PROMPT), None, sampling, False, send, RequestControl())
    return seq, Prefilled(sub, logits, 0, None, 0.0, 0), recv


async def test_a_lone_stream_steps_in_its_own_task_on_the_kernel_thread_with_plain_decodings_tokens():
    model = fake_kernel.Model(vocab_size=V, eos_id=V - 1)
    engine = Engine(fake_kernel, model, types.SimpleNamespace(eos_id=V - 1), 10_000, speculate=False,
                    slots=[Sequence(0)])
    steps = decode.DecodeSteps(engine)
    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            await n.start(steps.run)
            seq, pre, recv = await _prefilled(engine, GREEDY)
            await decode.run_decode(engine, pre, _Text(), {}, decode.feed_of(steps, seq))
            n.cancel_scope.cancel()
    want, want_state = _greedy_alone(model, GREEDY.max_tokens)
    assert _sent(recv) == want
    assert [int(t) for t in seq.state.tokens] == want_state
    assert steps.steps == GREEDY.max_tokens - 1
    assert steps.inline_steps == steps.steps            # every step ran in the request's task
    assert engine.runner.thread.calls == steps.steps + 1   # the prefill and every step: the one kernel thread


async def test_two_streams_still_step_together_in_the_stepping_task():
    model = fake_kernel.Model(vocab_size=V, eos_id=V - 1)
    engine = Engine(fake_kernel, model, types.SimpleNamespace(eos_id=V - 1), 10_000, speculate=False,
                    slots=[Sequence(0), Sequence(1)])
    steps = decode.DecodeSteps(engine, gather_s=10.0)    # a step waits for both (no timing involved)
    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            await n.start(steps.run)
            runs = []
            for i in range(2):
                seq = engine.slots[i]
                seq.request_id, seq.phase = f"r{i}", "decode"
                engine.new_state(seq)
                _, logits = await engine.run(DECODE, engine.kernel.prefill, seq.state,
                                             np.asarray(PROMPT, dtype=np.int32))
                send, recv = trio.open_memory_channel(1000)
                sub = Submit(f"r{i}", tuple(PROMPT), None, GREEDY, False, send, RequestControl())
                runs.append((seq, Prefilled(sub, logits, 0, None, 0.0, i), recv))
            async with trio.open_nursery() as both:
                for seq, pre, _ in runs:
                    both.start_soon(decode.run_decode, engine, pre, _Text(), {}, decode.feed_of(steps, seq))
            n.cancel_scope.cancel()
    want, _ = _greedy_alone(model, GREEDY.max_tokens)
    assert [_sent(recv) for _, _, recv in runs] == [want, want]
    assert steps.inline_steps == 0 and steps.rows == 2 * steps.steps   # batched: two rows a step


async def test_a_prefill_that_asks_during_a_lone_streams_step_gets_the_kernel_before_its_next_step():
    model = fake_kernel.Model(vocab_size=V, eos_id=V - 1)
    gate = Gate()
    engine = Engine(GatedKernel(fake_kernel, gate, V), model, types.SimpleNamespace(eos_id=V - 1), 10_000,
                    speculate=False, slots=[Sequence(0)])
    steps = decode.DecodeSteps(engine)
    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            await n.start(steps.run)
            seq, pre, recv = await _prefilled(engine, GREEDY)
            gate.hold()
            gate.allow(3)                                   # three steps, then the fourth waits in the kernel
            ended = trio.Event()

            async def go():
                await decode.run_decode(engine, pre, _Text(), {}, decode.feed_of(steps, seq))
                ended.set()

            n.start_soon(go)
            await gate.wait_blocked()
            assert steps.inline_steps == 3                  # the lone stream's own path ran
            turn, release = trio.Event(), trio.Event()

            async def prefill_chunk():                      # another request's prefill wants the kernel
                async with engine.gate.hold(prefill_priority(100)):
                    turn.set()
                    await release.wait()

            n.start_soon(prefill_chunk)
            await trio.testing.wait_all_tasks_blocked()
            decodes = gate.count("decode")                  # those done (a call is counted once let through)
            gate.allow(1)                                   # the step in the kernel ends ...
            await turn.wait()                               # ... and the prefill has the kernel
            await trio.testing.wait_all_tasks_blocked()
            assert gate.count("decode") == decodes + 1      # the stream's next step did not overtake it
            assert not gate.waiting
            assert len(steps._pending) == 1                 # it waits, queued, for the gate
            gate.allow(None)
            release.set()
            await ended.wait()
            n.cancel_scope.cancel()
    want, _ = _greedy_alone(model, GREEDY.max_tokens)
    assert _sent(recv) == want
