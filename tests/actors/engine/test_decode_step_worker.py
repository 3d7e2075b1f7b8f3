"""Decode steps through the kernel thread's GIL-free hand-off (actors/engine/call_thread.py, issue 41 §5).

With the real kernel, the engine's kernel thread serves `StepWorker` steps: a lone stream's steps
run there (the counter), give the tokens and state a plain greedy decode gives, and keep the call
thread's cancel rules -- a cancel before the step posts nothing; one during it is delivered after the
step ran, so the state is never torn.
"""

from __future__ import annotations

import threading
import types

import numpy as np
import trio
import trio.testing

import cairn._kernel as K
from decode_doubles import TagText, sent_tokens
from cairn.actors.engine import decode
from cairn.actors.engine.call_thread import CallThread
from cairn.actors.engine.engine import Engine
from cairn.actors.engine.kernel_gate import DECODE
from cairn.actors.engine.messages import Prefilled, RequestControl, Sampling, Submit
from cairn.actors.engine.sequence import Sequence
from cairn.daemon.weights.model_dir import load_model, open_model_dir

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
N = 20


def _model(tiny_model_dir):
    return load_model(open_model_dir(tiny_model_dir), 1)


def _plain_greedy(model) -> tuple[list[int], bytes]:
    st = K.State(model)
    _, logits = K.prefill(st, np.asarray(PROMPT, dtype=np.int32))
    out = []
    for i in range(N):
        out.append(int(np.argmax(logits)))
        if i < N - 1:
            logits = K.decode(st, out[-1])
    return out, st.snapshot().to_bytes()


async def test_a_lone_streams_steps_run_through_the_worker_with_plain_decodings_tokens(tiny_model_dir):
    model = _model(tiny_model_dir)
    eos = int(model.vocab_size) + 1                       # never sampled
    engine = Engine(K, model, types.SimpleNamespace(eos_id=eos), 10_000, speculate=False, slots=[Sequence(0)])
    assert engine.runner.thread.worker is not None
    steps = decode.DecodeSteps(engine)
    with trio.fail_after(60):
        async with trio.open_nursery() as n:
            await n.start(steps.run)
            seq = engine.slots[0]
            seq.request_id, seq.phase = "r0", "decode"
            engine.new_state(seq)
            _, logits = await engine.run(DECODE, K.prefill, seq.state, np.asarray(PROMPT, dtype=np.int32))
            send, recv = trio.open_memory_channel(1000)
            sub = Submit("r0", tuple(PROMPT), None, Sampling(max_tokens=N, temperature=0, ignore_eos=True), False,
                         send, RequestControl())
            stats: dict = {}
            await decode.run_decode(engine, Prefilled(sub, logits, 0, None, 0.0, 0), TagText(), stats,
                                    decode.feed_of(steps, seq))
            n.cancel_scope.cancel()
    want, want_state = _plain_greedy(model)
    assert sent_tokens(recv) == want
    assert seq.state.snapshot().to_bytes() == want_state
    assert steps.steps == N - 1
    assert engine.runner.thread.steps == steps.steps       # every step went through the worker
    assert engine.runner.thread.calls == 1                  # the prefill alone took the Python path
    assert seq.figures.n_tokens == len(PROMPT) + N - 1      # published after each step


async def test_a_cancel_during_a_step_is_delivered_after_it_and_one_before_posts_nothing(tiny_model_dir):
    model = _model(tiny_model_dir)
    st, ref = K.State(model), K.State(model)
    for s in (st, ref):
        K.prefill(s, np.asarray(PROMPT, dtype=np.int32))
    ct = CallThread(worker=K.StepWorker())
    with trio.fail_after(60):
        with trio.CancelScope() as scope:                   # cancelled before: nothing posted, nothing ran
            scope.cancel()
            await ct.run_step(st, 5)
        assert ct.steps == 0 and ct.worker.idle and int(st.n_tokens) == len(PROMPT)

        # The thread is held in a Python call, so the posted step waits; the cancel comes meanwhile.
        release = threading.Event()
        got: list = []

        async def held():
            await ct.run_sync(release.wait)

        async def step(scope_box):
            with trio.CancelScope() as scope:
                scope_box.append(scope)
                got.append(await ct.run_step(st, 5))      # shielded: returns though cancelled
                got.append("past the step")
                await trio.lowlevel.checkpoint()          # the cancel lands here
                got.append("not reached")

        async with trio.open_nursery() as n:
            n.start_soon(held)
            await trio.testing.wait_all_tasks_blocked()
            box: list = []
            n.start_soon(step, box)
            await trio.testing.wait_all_tasks_blocked()
            assert ct.worker.in_flight and not got
            box[0].cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert not got                                  # the step has not run: still waiting for it
            release.set()
    assert got[1:] == ["past the step"]
    np.testing.assert_array_equal(got[0][0], K.decode(ref, 5))
    assert int(st.n_tokens) == len(PROMPT) + 1 and ct.steps == 1 and ct.worker.idle
