"""A plain (no draft) decode step withdrawn by a cancel never leaves its request waiting (issue 40, the
soak's wedge): the client hangs up while the request's next step is queued behind another request's
prefill. `DecodeSteps.wait` withdraws the step, then `run_decode`'s cleanup lets it go a second time;
before a488a68 that second `let_go` waited, shielded, for a step that would never run — the request
stayed in decode, its slot never freed, and SIGTERM could not end the daemon.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
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
GREEDY = Sampling(max_tokens=40, temperature=0, ignore_eos=True)


async def test_a_cancel_while_its_plain_step_is_queued_ends_the_request_and_the_kernel_never_sees_it():
    model = fake_kernel.Model(vocab_size=V, eos_id=V - 1)
    gate = Gate()
    engine = Engine(GatedKernel(fake_kernel, gate, V), model, types.SimpleNamespace(eos_id=V - 1), 10_000,
                    speculate=False, slots=[Sequence(0)])
    steps = decode.DecodeSteps(engine)
    request, ended = trio.CancelScope(), trio.Event()
    with trio.fail_after(30):                               # a hang guard: the test fails below first
        async with trio.open_nursery() as n:
            await n.start(steps.run)
            seq = engine.slots[0]
            seq.request_id, seq.phase = "r0", "decode"
            engine.new_state(seq)
            _, logits = await engine.run(DECODE, engine.kernel.prefill, seq.state, np.asarray(PROMPT, dtype=np.int32))
            send, recv = trio.open_memory_channel(1000)
            sub = Submit("r0", tuple(PROMPT), None, GREEDY, False, send, RequestControl())
            pre = Prefilled(sub, logits, 0, None, 0.0, 0)
            gate.hold()
            gate.allow(2)                                   # two steps, then the third is held in the kernel

            async def go():
                with request:
                    await decode.run_decode(engine, pre, _Text(), {}, decode.feed_of(steps, seq))
                ended.set()

            n.start_soon(go)
            await gate.wait_blocked()
            release, other = trio.Event(), trio.Event()

            async def prefill_holder():                     # another request's prefill chunk wants the kernel
                async with engine.gate.hold(prefill_priority(100)):
                    other.set()
                    await release.wait()

            n.start_soon(prefill_holder)
            await trio.testing.wait_all_tasks_blocked()
            gate.allow(1)                                   # the step ends; the prefill takes the kernel
            await other.wait()
            await trio.testing.wait_all_tasks_blocked()     # the request's next step is queued behind it
            assert len(steps._pending) == 1 and not steps._pending[0].draft
            entry, calls = steps._pending[0], len(gate.calls)
            request.cancel()                                # the client is gone
            await trio.testing.wait_all_tasks_blocked()
            assert not steps._pending                       # withdrawn at once
            stuck = not ended.is_set()
            if stuck:                                       # let the waiting cleanup go, then fail
                entry.done.set()
                await ended.wait()
            release.set()
            n.cancel_scope.cancel()
    if stuck:
        pytest.fail("the request's cleanup waited for a decode step it had withdrawn")
    assert request.cancelled_caught
    assert len(gate.calls) == calls                         # the kernel never saw the withdrawn step
    delivered = _sent(recv)
    # the state holds the prompt and every delivered token but the last (its step was withdrawn)
    assert [int(t) for t in seq.state.tokens] == PROMPT + delivered[:-1]
