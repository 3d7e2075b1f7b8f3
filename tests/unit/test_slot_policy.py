"""Pure slot choice and the kernel gate's order (slots > 1)."""

import numpy as np
import trio
import trio.testing

from cairn.actors.engine.kernel_gate import DECODE, KernelGate, prefill_priority
from cairn.actors.engine.slot_policy import SlotView, choose_slot, shared_prefix


def _v(i, tokens, busy=False, used=0.0):
    return SlotView(i, busy, None if tokens is None else np.asarray(tokens, np.int32), used)


def test_slot_with_the_longest_live_prefix_wins():
    prompt = np.asarray([1, 2, 3, 4, 5], np.int32)
    slots = [_v(0, [1, 2]), _v(1, [1, 2, 3]), _v(2, [9]), _v(3, [1, 2, 3, 4], busy=True)]
    c = choose_slot(slots, prompt)
    assert (c.index, c.shared) == (1, 3)


def test_no_prefix_takes_an_empty_slot_then_the_least_recently_used():
    prompt = np.asarray([7, 7], np.int32)
    assert choose_slot([_v(0, [1], used=1.0), _v(1, None, used=5.0)], prompt).index == 1
    c = choose_slot([_v(0, [1], used=9.0), _v(1, [2], used=3.0), _v(2, [3], used=4.0)], prompt)
    assert (c.index, c.shared) == (1, 0)
    assert choose_slot([_v(0, [7], busy=True)], prompt) is None


def test_live_tokens_longer_than_the_prompt_are_no_prefix():
    assert shared_prefix(np.asarray([1, 2, 3], np.int32), np.asarray([1, 2], np.int32)) == 0
    assert shared_prefix(np.asarray([], np.int32), np.asarray([1], np.int32)) == 0


async def test_gate_serves_decode_then_shortest_prefill_then_arrival_order():
    gate = KernelGate()
    order = []
    release = trio.Event()

    async def holder():
        async with gate.hold(prefill_priority(1000)):
            await release.wait()
        order.append("holder")

    async def want(name, prio):
        async with gate.hold(prio):
            order.append(name)

    async with trio.open_nursery() as n:
        n.start_soon(holder)
        await trio.testing.wait_all_tasks_blocked()
        n.start_soon(want, "long", prefill_priority(900))
        await trio.testing.wait_all_tasks_blocked()
        n.start_soon(want, "short", prefill_priority(20))
        await trio.testing.wait_all_tasks_blocked()
        n.start_soon(want, "short2", prefill_priority(20))
        await trio.testing.wait_all_tasks_blocked()
        n.start_soon(want, "decode", DECODE)
        await trio.testing.wait_all_tasks_blocked()
        release.set()
    assert order == ["holder", "decode", "short", "short2", "long"]


async def test_a_cancelled_waiter_leaves_the_gate_usable():
    gate = KernelGate()
    release = trio.Event()
    got = []

    async def holder():
        async with gate.hold(prefill_priority(5)):
            await release.wait()

    async with trio.open_nursery() as n:
        n.start_soon(holder)
        await trio.testing.wait_all_tasks_blocked()
        with trio.CancelScope() as cs:
            cs.cancel()
            async with gate.hold(DECODE):
                got.append("never")
        release.set()
    async with gate.hold(DECODE):
        got.append("after")
    assert got == ["after"] and gate.waiting == 0
