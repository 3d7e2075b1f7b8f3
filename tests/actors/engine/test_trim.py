"""actors/engine/trim.py: freed heap goes back to the OS once per idle period, after the quiet time, never
while a request is in flight; and glibc's malloc_trim really returns pages a fragmented heap holds."""

from __future__ import annotations

import sys

import trio
import trio.testing

from cairn.actors.engine import trim as trim_mod
from cairn.actors.engine.trim import IdleTrim, malloc_trim
from skip_policy import host_cannot


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict]] = []

    def debug(self, event: str, **kw) -> None:
        self.lines.append((event, kw))


async def test_one_trim_per_idle_period_after_the_quiet_time_and_none_while_busy(autojump_clock):
    calls = []
    log = Log()

    async def inline(fn):                   # the trim in the loop: the autojump clock sees its time
        return fn()

    t = IdleTrim(log, quiet_s=2.0, trim=lambda: calls.append(trio.current_time()) or 4096, in_thread=inline)
    async with trio.open_nursery() as n:
        await n.start(t.run)
        await trio.sleep(10)
        assert calls == []                  # a fresh daemon: nothing freed yet
        t.note(True)                        # a request admitted
        await trio.sleep(10)
        assert calls == []                  # never while busy
        t.note(False)
        await trio.sleep(1.0)
        t.note(True)                        # the next turn came within the quiet time
        await trio.sleep(5)
        assert calls == []
        t.note(False)
        start = trio.current_time()
        await trio.sleep(30)
        assert len(calls) == 1 and calls[0] - start >= 2.0   # once, after the quiet time, not again
        assert log.lines == [("malloc_trim", {"returned_bytes": 4096, "rss_bytes": log.lines[0][1]["rss_bytes"]})]
        t.note(True)
        t.note(False)                       # the next idle period trims again
        await trio.sleep(3)
        assert len(calls) == 2 and t.trims == 2
        n.cancel_scope.cancel()


async def test_admission_reports_busy_while_a_request_runs_and_idle_after_it_finished():
    from cairn.actors.engine.admission import admission
    from cairn.actors.engine.messages import Finished, RequestControl, Sampling, Submit

    seen: list[bool] = []
    inbox_send, inbox = trio.open_memory_channel(8)
    to_prefill, prefill_recv = trio.open_memory_channel(1)
    reply_send, _reply_recv = trio.open_memory_channel(8)
    with trio.fail_after(5):
        async with trio.open_nursery() as n:
            await n.start(lambda task_status: admission(inbox, to_prefill, queue_size=2, log=Log(),
                                                        note_busy=seen.append, task_status=task_status))
            await inbox_send.send(Submit("r", (1, 2), None, Sampling(max_tokens=2, temperature=0), False,
                                         reply_send, RequestControl()))
            await prefill_recv.receive()
            assert seen == [True]
            await inbox_send.send(Finished("r", "done"))
            await trio.testing.wait_all_tasks_blocked()
            assert seen == [True, False]
            await inbox_send.aclose()


def test_malloc_trim_returns_the_free_pages_of_a_fragmented_heap():
    if not sys.platform.startswith("linux") or trim_mod._TRIM is None:
        host_cannot("glibc's malloc_trim (Linux with glibc); elsewhere trimming is a no-op")
    malloc_trim()
    # 64 KiB blocks come from malloc's heap (below the mmap threshold); keeping every 16th alive
    # leaves the freed ones between them, which free() alone cannot give back (not at the heap's top)
    blocks = [bytearray(64 << 10) for _ in range(1024)]      # 64 MiB, touched (zeroed)
    keep = blocks[::16]
    del blocks
    returned = malloc_trim()
    assert returned is not None and returned > 16 << 20, returned
    del keep
