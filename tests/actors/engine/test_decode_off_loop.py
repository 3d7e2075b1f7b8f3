"""Sampling a large vocabulary runs off the event loop (issue 10, item 5)."""

from __future__ import annotations

import threading
import types

import numpy as np
import trio

from cairn.actors.engine import decode
from cairn.actors.engine.messages import Prefilled, RequestControl, Sampling, Submit


class _InlineRunner:
    async def run(self, fn, *args, **kwargs):
        await trio.lowlevel.checkpoint()
        return fn(*args, **kwargs)

    async def decode(self, kernel, state, token, spent, tally=None):
        return await self.run(kernel.decode, state, token)


class _Text:
    def push(self, tok):
        return "t"

    def hidden_text(self, tok):      # no control token is dropped from this text
        return None

    def flush(self):
        return ""


async def _decode_threads(vocab: int, monkeypatch) -> set:
    threads = set()
    real = decode.choose

    def spy(logits, s, rng):
        threads.add(threading.current_thread() is threading.main_thread())
        return real(logits, s, rng)

    monkeypatch.setattr(decode, "choose", spy)
    logits = np.random.default_rng(0).standard_normal(vocab).astype(np.float32)
    engine = types.SimpleNamespace(
        model=types.SimpleNamespace(vocab_size=vocab), tokenizer=types.SimpleNamespace(eos_id=None),
        context_length=1024, runner=_InlineRunner(),
        kernel=types.SimpleNamespace(decode=lambda state, tok: logits))

    async def wait(tok):    # the decode worker's batched step, reduced to one state
        return await engine.runner.run(engine.kernel.decode, None, tok)

    async def let_go(tok):
        return None

    feed = decode.Feed(lambda tok, tally: tok, wait, let_go)
    send, recv = trio.open_memory_channel(64)
    sub = Submit("r", (1, 2), None, Sampling(max_tokens=3, temperature=0.8, top_p=0.9, seed=1), False, send,
                 RequestControl())
    done = await decode.run_decode(engine, Prefilled(sub, logits, 0, None, 0.0), _Text(), {}, feed)
    assert done.usage.completion_tokens == 3
    return threads


async def test_sampling_a_large_vocabulary_runs_off_the_event_loop(monkeypatch):
    assert await _decode_threads(129_280, monkeypatch) == {False}


async def test_sampling_a_small_vocabulary_stays_on_the_loop(monkeypatch):
    assert await _decode_threads(64, monkeypatch) == {True}
