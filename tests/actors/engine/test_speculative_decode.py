"""The decode loop with drafts (actors/engine/decode.py run_decode), against a toy model with the kernel's
verify / rewind semantics: whatever way a reply ends (length, EOS, a stop string, a client that
goes, inside a draft or not), the reply is the one plain decoding gives and the state holds the
prompt and every reply token but the last — nothing a rejected or unused draft fed is left in it.
"""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest
import trio
import trio.testing

import fake_kernel
from decode_doubles import sent_tokens as _sent
from gated_kernel import Gate, GatedKernel
from cairn.actors.engine import decode
from cairn.actors.decoding.drafts import longest_match
from cairn.actors.engine.engine import Engine
from cairn.actors.engine.kernel_gate import DECODE, prefill_priority
from cairn.actors.engine.lifecycle import ClientGone
from cairn.actors.engine.memory_guard import MemoryGuard
from cairn.actors.engine.messages import Prefilled, RequestControl, Sampling, Submit, TokenOut
from cairn.actors.engine.sequence import Sequence
from cairn.actors.decoding.speculation import WARMUP_CALLS
from cairn.daemon.service.memory_plan import LimitSource, ModelBytes, StateCost, plan_memory

V = 12
EOS = 11


def toy_logits(history: list[int]) -> np.ndarray:
    """A deterministic 'model' that mostly repeats a period-5 pattern and sometimes breaks it."""
    rng = np.random.default_rng(hash(tuple(history[-3:])) % (2**32))
    x = rng.standard_normal(V) * 0.5
    x[(history[-5] if len(history) >= 5 else 3) % (V - 1)] += 2.5      # the pattern: copy from 5 back
    return x.astype(np.float32)


class ToyFeed:
    """The verify step on a list of tokens; `fed` records every call as (token, draft, rewind)."""

    def __init__(self, prompt, speculative: bool):
        self.state = list(prompt)
        self.rewindable = 0
        self.fed: list = []
        self.picked: list = []
        self.speculative = speculative

    def feed(self) -> decode.Feed:
        return decode.Feed(self.submit, self.wait, self.let_go, self.rewind, speculative=self.speculative)

    def submit(self, tok, tally, draft=(), rewind=0):
        return types.SimpleNamespace(tok=tok, draft=tuple(draft), rewind=rewind, ran=False, draft_cost=0.25)

    def _run(self, h):
        if not h.ran:
            h.ran = True
            assert h.rewind <= self.rewindable
            del self.state[len(self.state) - h.rewind:]
            rows = []
            for t in (h.tok, *h.draft):
                self.state.append(t)
                rows.append(toy_logits(self.state))
            self.rewindable = 1 + len(h.draft)
            self.fed.append((h.tok, h.draft, h.rewind))
            h.out = np.stack(rows) if h.draft or h.rewind else rows[0]

    async def wait(self, h):
        await trio.lowlevel.checkpoint()
        self._run(h)
        return h.out

    async def let_go(self, h):
        return h.ran

    async def rewind(self, k):
        assert k <= self.rewindable
        del self.state[len(self.state) - k:]
        self.rewindable -= k


class _Text:
    def __init__(self):
        self.out = []

    def push(self, tok):
        return f"<{tok}>"

    def hidden_text(self, tok):      # no control token is dropped from this text
        return None

    def flush(self):
        return ""


async def _run(prompt, sampling, speculative, *, gone_after=None):
    """(reply tokens, the toy state, the feed) of one run_decode; `gone_after`: the client stops
    reading after that many tokens (ClientGone)."""
    engine = types.SimpleNamespace(model=types.SimpleNamespace(vocab_size=V),
                                   tokenizer=types.SimpleNamespace(eos_id=EOS), context_length=10_000)
    toy = ToyFeed(prompt, speculative)
    send, recv = trio.open_memory_channel(1000)
    sub = Submit("r", tuple(prompt), None, sampling, False, send, RequestControl())
    got = []

    async def sender_patch(sub_, msg):
        if isinstance(msg, TokenOut):
            toy.picked.append(msg.token_id)
            if gone_after is not None and len(got) >= gone_after:
                raise ClientGone(stalled=False)
            got.append(msg.token_id)

    real_send = decode._send
    decode._send = sender_patch
    try:
        pre = Prefilled(sub, toy_logits(list(prompt)), 0, None, 0.0)
        try:
            await decode.run_decode(engine, pre, _Text(), {}, toy.feed())
        except ClientGone:
            pass
    finally:
        decode._send = real_send
    return got, toy.state, toy


PROMPT = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3]


@pytest.mark.parametrize("sampling", [
    Sampling(max_tokens=40, temperature=0, ignore_eos=True),
    Sampling(max_tokens=37, temperature=0.8, seed=3, ignore_eos=True),
    Sampling(max_tokens=60, temperature=0.7, seed=5),                         # may end at EOS
    Sampling(max_tokens=60, temperature=0, stop=("<4><5>",), ignore_eos=True),  # ends at a stop string
])
async def test_replies_and_the_state_left_are_those_of_plain_decoding(sampling):
    plain, plain_state, plain_toy = await _run(PROMPT, sampling, speculative=False)
    spec, spec_state, toy = await _run(PROMPT, sampling, speculative=True)
    assert spec == plain
    # the last token sent is never fed (an EOS is not sent at all, and the tokens before it are fed)
    assert spec_state == plain_state == (PROMPT + plain)[:len(plain_state)]
    assert len(plain_state) >= len(PROMPT) + len(plain) - 1
    assert any(draft for _, draft, _ in toy.fed), "drafts were sent"
    if len(plain) > 20:
        assert len(toy.fed) < len(plain_toy.fed), "accepted drafts saved calls"


@pytest.mark.parametrize("after", [1, 3, 7, 12, 20])
async def test_a_client_that_goes_leaves_no_draft_behind(after):
    """The client stops reading after `after` tokens: the state holds the prompt and the reply's
    tokens so far — the one being sent when the client went fed or not, as in plain decoding (a
    step handed in may or may not have started) — and none of a draft's tokens beyond them."""
    s = Sampling(max_tokens=40, temperature=0, ignore_eos=True)
    plain, _, _ = await _run(PROMPT, s, speculative=False, gone_after=after)
    spec, spec_state, toy = await _run(PROMPT, s, speculative=True, gone_after=after)
    assert spec == plain and len(spec) == after
    picked = toy.picked                     # the sent tokens and the one whose send failed
    assert picked[:after] == spec and len(picked) == after + 1
    assert spec_state == (PROMPT + picked)[:len(spec_state)]
    assert len(PROMPT) + after <= len(spec_state) <= len(PROMPT) + after + 1


# --- The decode worker's speculative step (DecodeSteps), with the fake kernel's verify / rewind --------


FV = 128                      # the fake model's vocabulary
FEOS = FV - 1
PATTERN = list(range(1, 9))   # period 8: prompt lookup drafts what follows
P_PROMPT = PATTERN * 4


def follow_lookup(history):
    """A model that continues as prompt lookup guesses: every draft is accepted."""
    d = longest_match(history, 1)
    return d[0] if d else PATTERN[0]


def against_lookup(history):
    """A model that never continues as prompt lookup guesses: every draft is rejected."""
    d = longest_match(history, 1)
    return d[0] % 8 + 1 if d else PATTERN[0]


def sometimes_against(history):
    """Follows the lookup except at every fifth position: drafts are partly accepted."""
    return against_lookup(history) if len(history) % 5 == 0 else follow_lookup(history)


def _engine(kernel, model, *, slots: int = 1, speculate: bool = True) -> Engine:
    return Engine(kernel, model, types.SimpleNamespace(eos_id=FEOS), 10_000, speculate=speculate,
                  slots=[Sequence(i) for i in range(slots)])


async def _prefilled(engine: Engine, index: int, prompt, sampling) -> tuple:
    """Slot `index` prefilled with `prompt` for a request of `sampling`: (Prefilled, its reply channel)."""
    seq = engine.slots[index]
    seq.request_id, seq.phase = f"r{index}", "decode"
    engine.new_state(seq)
    _, logits = await engine.run(DECODE, engine.kernel.prefill, seq.state, np.asarray(prompt, dtype=np.int32))
    send, recv = trio.open_memory_channel(1000)
    sub = Submit(f"r{index}", tuple(prompt), None, sampling, False, send, RequestControl())
    return Prefilled(sub, logits, 0, None, 0.0, index), recv


async def _decode_steps(model, prompt, sampling, *, speculate=True, memory=None):
    """One request decoded through DecodeSteps: (Done, tokens sent, its sequence, the steps, stats)."""
    engine = _engine(fake_kernel, model, speculate=speculate)
    if memory is not None:
        engine.memory = MemoryGuard(memory, engine)
    steps = decode.DecodeSteps(engine)
    stats: dict = {}
    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            await n.start(steps.run)
            pre, recv = await _prefilled(engine, 0, prompt, sampling)
            seq = engine.slots[0]
            done = await decode.run_decode(engine, pre, _Text(), stats, decode.feed_of(steps, seq))
            n.cancel_scope.cancel()
    return done, _sent(recv), seq, steps, stats


def _tokens_of(seq) -> list[int]:
    return [int(t) for t in np.asarray(seq.state.tokens)]


GREEDY = Sampling(max_tokens=40, temperature=0, ignore_eos=True)


async def test_a_step_with_an_accepted_draft_verifies_it_in_one_call():
    plain_model = fake_kernel.Model(vocab_size=FV, eos_id=FEOS, rule=follow_lookup)
    _, plain, plain_seq, _, _ = await _decode_steps(plain_model, P_PROMPT, GREEDY, speculate=False)
    model = fake_kernel.Model(vocab_size=FV, eos_id=FEOS, rule=follow_lookup)
    done, got, seq, steps, stats = await _decode_steps(model, P_PROMPT, GREEDY)
    assert got == plain and done.usage.completion_tokens == 40
    spec = stats["speculation"]
    assert spec["accepted"] == spec["drafted"] > 0                    # every draft kept
    verifies = [n for k, n in model.calls if k == "verify"]
    assert verifies and max(verifies) > 1 and steps.verify_steps == len(verifies)
    assert len(verifies) < sum(1 for k, _ in plain_model.calls if k == "decode")   # fewer kernel calls
    # the state holds the prompt and every reply token but the last, as plain decoding leaves it
    assert _tokens_of(seq) == _tokens_of(plain_seq) == P_PROMPT + got[:-1]
    assert seq.state.rewindable <= 1 + MAX_DRAFT_ROOM


MAX_DRAFT_ROOM = 16


async def test_a_partly_rejected_draft_is_rewound_and_the_reply_is_plain_decodings():
    plain_model = fake_kernel.Model(vocab_size=FV, eos_id=FEOS, rule=sometimes_against)
    _, plain, plain_seq, _, _ = await _decode_steps(plain_model, P_PROMPT, GREEDY, speculate=False)
    model = fake_kernel.Model(vocab_size=FV, eos_id=FEOS, rule=sometimes_against)
    _, got, seq, steps, stats = await _decode_steps(model, P_PROMPT, GREEDY)
    assert got == plain
    spec = stats["speculation"]
    assert 0 < spec["accepted"] < spec["drafted"]
    assert any(k > 0 for k in model.rewinds)                         # the rejected tails were taken back
    assert _tokens_of(seq) == _tokens_of(plain_seq) == P_PROMPT + got[:-1]


def _memory_plan(pool: int, vocab: int):
    """A memory plan whose pool (live states and checkpoints) is `pool` bytes, for the fake kernel's states."""
    cost = StateCost(("heavily_compressed_attention",), window=1, head_dim=16, index_head_dim=16, csa_rate=4,
                     hca_rate=1, vocab=vocab)
    base = plan_memory(limit=LimitSource("test", 1 << 30, 0, "/test"), weights=ModelBytes(1 << 20, 0), state=cost,
                       context_length=65536, slots_setting=1, checkpoint_setting=0)
    return dataclasses.replace(base, state_bytes=pool, checkpoint_bytes=0, transient_bytes=0), cost


async def test_a_draft_without_room_in_the_memory_plan_is_not_sent_and_the_step_decodes_plainly():
    """The reply ends (EOS) after L tokens; the plan has room for exactly the state plain decoding
    leaves (prompt + L). Drafts are sized for max_tokens, so near the end they would pass it: the
    step goes without its draft (no 507), and the reply is plain decoding's."""
    L = 30
    P = len(P_PROMPT)

    def rule(history):
        return FEOS if len(history) == P + L else follow_lookup(history)

    sampling = Sampling(max_tokens=200, temperature=0)
    plan, cost = _memory_plan(0, FV)
    plan = dataclasses.replace(plan, state_bytes=cost.resident_at(P + L))
    assert cost.resident_at(P + L + 1) > plan.pool_bytes               # one token more would not fit
    plain_model = fake_kernel.Model(vocab_size=FV, eos_id=FEOS, rule=rule)
    pdone, plain, _, _, _ = await _decode_steps(plain_model, P_PROMPT, sampling, speculate=False, memory=plan)
    assert pdone.finish_reason == "stop" and len(plain) == L          # plain decoding fits (EOS is not sent)
    model = fake_kernel.Model(vocab_size=FV, eos_id=FEOS, rule=rule)
    done, got, seq, steps, stats = await _decode_steps(model, P_PROMPT, sampling, memory=plan)
    assert done.finish_reason == "stop" and got == plain
    assert stats["speculation"]["no_room"] >= 1 and steps.drafts_dropped == stats["speculation"]["no_room"]
    assert ("decode", 1) in model.calls                                # a step ran without its draft
    assert stats["speculation"]["accepted"] > 0                        # drafts with room were sent
    assert _tokens_of(seq) == P_PROMPT + got


async def test_auto_off_is_per_request_with_two_slots():
    """Two requests decoding in the same batched steps: the one whose drafts are all rejected turns
    drafting off for itself; the one whose drafts are all kept goes on drafting. Each reply is plain
    decoding's."""
    A, B = [100] + P_PROMPT, [101] + P_PROMPT

    def rule(history):
        return against_lookup(history) if history[0] == 100 else follow_lookup(history)

    sampling = Sampling(max_tokens=60, temperature=0, ignore_eos=True)
    replies = {}
    for speculate in (False, True):
        model = fake_kernel.Model(vocab_size=FV, eos_id=FEOS, rule=rule, copy=False)
        engine = _engine(fake_kernel, model, slots=2, speculate=speculate)
        steps = decode.DecodeSteps(engine)
        stats = [{}, {}]
        got = [None, None]
        with trio.fail_after(30):
            async with trio.open_nursery() as n:
                await n.start(steps.run)
                pres = [await _prefilled(engine, i, p, sampling) for i, p in enumerate((A, B))]
                async with trio.open_nursery() as both:
                    for i, (pre, recv) in enumerate(pres):
                        async def one(i=i, pre=pre, recv=recv):
                            await decode.run_decode(engine, pre, _Text(), stats[i],
                                                    decode.feed_of(steps, engine.slots[i]))
                            got[i] = _sent(recv)
                        both.start_soon(one)
                n.cancel_scope.cancel()
        replies[speculate] = got
    assert replies[True] == replies[False]
    a, b = stats[0]["speculation"], stats[1]["speculation"]
    assert a["accepted"] == 0 and a["drafts"] >= WARMUP_CALLS and a["off"] >= 1     # off for itself
    assert b["accepted"] == b["drafted"] > 0 and b["off"] == 0                      # still drafting
    assert b["drafts"] > a["drafts"]
    assert steps.batched_verify_steps > 0                                           # they shared steps


def _gated_engine(rule):
    """A fake engine whose kernel goes through a permit gate (the test sets its pace)."""
    model = fake_kernel.Model(vocab_size=FV, eos_id=FEOS, rule=rule, copy=False)
    gate = Gate()
    engine = _engine(GatedKernel(fake_kernel, gate, FV), model)
    return engine, gate, decode.DecodeSteps(engine), model


async def test_a_cancel_during_a_verify_step_waits_for_it_then_takes_its_draft_back():
    """The request is cancelled while its verify step is in the kernel: the cancel completes only once
    the step has finished; then the step's draft is taken back, and the state holds the prompt and
    exactly the tokens delivered (the last one included: that step fed it) — nothing half-applied."""
    engine, gate, steps, model = _gated_engine(follow_lookup)
    request, ended = trio.CancelScope(), trio.Event()
    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            await n.start(steps.run)
            pre, recv = await _prefilled(engine, 0, P_PROMPT, GREEDY)
            seq = engine.slots[0]
            gate.hold()
            gate.allow(3)                                   # three steps, then the fourth is held in the kernel

            async def go():
                with request:
                    await decode.run_decode(engine, pre, _Text(), {}, decode.feed_of(steps, seq))
                ended.set()

            n.start_soon(go)
            await gate.wait_blocked()
            request.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert not ended.is_set()                       # it waits for the step in the kernel
            rewinds = len(model.rewinds)
            gate.allow(None)
            await ended.wait()
            n.cancel_scope.cancel()
    assert request.cancelled_caught
    kind, fed = gate.calls[-1]                              # the held step: a verify with a draft
    assert kind == "verify" and fed > 1 and [k for k, _ in gate.calls[-4:]] == ["verify"] * 4
    assert model.rewinds[rewinds:] == [fed - 1]             # its draft, taken back after it finished
    delivered = _sent(recv)
    assert _tokens_of(seq) == P_PROMPT + delivered


async def test_a_cancel_before_its_step_runs_withdraws_it_and_takes_back_the_last_verifys_tail():
    """The request's next step is queued (a prefill holds the kernel) when it is cancelled: the step
    is withdrawn, the kernel never sees it, and what the last verify fed beyond the reply is taken
    back: the state holds the prompt and the delivered tokens but the last (never fed)."""
    engine, gate, steps, model = _gated_engine(sometimes_against)
    request, ended = trio.CancelScope(), trio.Event()
    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            await n.start(steps.run)
            pre, recv = await _prefilled(engine, 0, P_PROMPT, GREEDY)
            seq = engine.slots[0]
            gate.hold()
            gate.allow(WITHDRAW_AFTER)

            async def go():
                with request:
                    await decode.run_decode(engine, pre, _Text(), {}, decode.feed_of(steps, seq))
                ended.set()

            n.start_soon(go)
            await gate.wait_blocked()                       # a step is in the kernel
            other = trio.Event()
            release = trio.Event()

            async def prefill_holder():                     # another request's prefill wants the kernel next
                async with engine.gate.hold(prefill_priority(100)):
                    other.set()
                    await release.wait()

            n.start_soon(prefill_holder)
            await trio.testing.wait_all_tasks_blocked()
            gate.allow(1)                                   # the step finishes; the prefill takes the kernel
            await other.wait()
            await trio.testing.wait_all_tasks_blocked()     # the next step is queued behind it
            calls, rewinds = len(gate.calls), len(model.rewinds)
            assert steps._pending and steps._pending[0].rewind > 0   # it owes a rejected tail
            owed = steps._pending[0].rewind
            entry = steps._pending[0]
            request.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert not steps._pending                       # withdrawn at once
            release.set()
            with trio.move_on_after(10):
                await ended.wait()
            if not ended.is_set():                          # let the stuck cleanup go, then fail
                entry.done.set()
                await ended.wait()
                pytest.fail("the request's cleanup waited forever for a step it had withdrawn")
            n.cancel_scope.cancel()
    assert len(gate.calls) == calls                         # the kernel never saw the withdrawn step
    assert model.rewinds[rewinds:] == [owed]
    delivered = _sent(recv)
    assert _tokens_of(seq) == P_PROMPT + delivered[:-1]


WITHDRAW_AFTER = 0
