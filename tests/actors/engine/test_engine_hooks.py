"""The memory plan's hook (Engine.room_for): called before every kernel call that grows a sequence's
state, with the tokens it adds -- each prefill piece (a segment with one slot, a chunk with
several) and each decode step, per sequence."""

from __future__ import annotations

import trio
from structlog.testing import capture_logs

from cairn.actors.engine.engine import Engine
from daemon_harness import daemon, fake_loaded, request


def _body(prompt, n):
    return {"model": "tiny", "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}


async def _growth(tiny_model_dir, tmp_path, monkeypatch, **settings) -> list:
    seen: list = []
    monkeypatch.setattr(Engine, "room_for", lambda self, seq, n: seen.append((seq.index, n)))
    with trio.fail_after(30), capture_logs():
        async with daemon(fake_loaded(tiny_model_dir), tmp_path / "c.sock", checkpoints=False, **settings):
            r = await request(tmp_path / "c.sock", "POST", "/v1/completions", _body(list(range(10, 30)), 3))
    assert r.status == 200
    return seen


async def test_room_for_sees_each_segment_and_decode_step_with_one_slot(tiny_model_dir, tmp_path, monkeypatch):
    seen = await _growth(tiny_model_dir, tmp_path, monkeypatch, slots=1, chunk=4, segment=8)
    # 20 prompt tokens in segments of 8, then two decode steps (the third token is never fed)
    assert seen == [(0, 8), (0, 8), (0, 4), (0, 1), (0, 1)]


async def test_room_for_sees_each_chunk_with_several_slots(tiny_model_dir, tmp_path, monkeypatch):
    seen = await _growth(tiny_model_dir, tmp_path, monkeypatch, slots=2, chunk=4, segment=8)
    assert seen == [(0, 4)] * 5 + [(0, 1), (0, 1)]
