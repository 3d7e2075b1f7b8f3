"""Prefill progress in the log (issue 42 §1): one line per segment at info, one per kernel call at
debug. With several slots every kernel call is one chunk (actors/engine/engine.py piece_tokens), which
used to give an info line per chunk: ~500 for a 64k prompt."""

from __future__ import annotations

import logging

import structlog
import trio
from structlog.testing import capture_logs

from daemon_harness import daemon, fake_loaded, request


async def test_two_slots_log_a_line_per_segment_at_info_and_per_chunk_at_debug(tiny_model_dir, tmp_path):
    loaded = fake_loaded(tiny_model_dir)
    sock = tmp_path / "c.sock"
    old = structlog.get_config()["wrapper_class"]
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        with trio.fail_after(30), capture_logs() as events:
            async with daemon(loaded, sock, slots=2, chunk=16, segment=64, checkpoints=False):
                r = await request(sock, "POST", "/v1/completions",
                                  {"model": "tiny", "prompt": list(range(20, 120)), "max_tokens": 2,
                                   "temperature": 0, "ignore_eos": True})
                assert r.status == 200, r.body
    finally:
        structlog.configure(wrapper_class=old)
    segs = [e for e in events if e["event"] == "prefill_segment"]
    chunks = [e for e in events if e["event"] == "prefill_chunk"]
    # 100 tokens in calls of 16: the segment of 64 ends at the 4th call (64), the prompt at the 7th (100)
    assert [e["tokens_done"] for e in segs] == [64, 100]
    assert all(e["log_level"] == "info" and e["tokens_total"] == 100 for e in segs)
    assert [e["tokens_done"] for e in chunks] == [16, 32, 48, 80, 96]
    assert all(e["log_level"] == "debug" for e in chunks)
