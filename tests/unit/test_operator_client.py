"""Pure pieces of the operator side: progress throttling, SSE parsing, the CLI's tables and lines."""

from __future__ import annotations

import io

import pytest
import trio
import trio.testing

from cairn.actors.engine.messages import Progress, RequestControl, Sampling, Started, Submit, TokenOut
from cairn.actors.engine.progress import ProgressReporter
from cairn.daemon.cli.client import (ClientError, ProgressDisplay, format_checkpoints, format_status, iter_sse,
                                 progress_line)
from cairn.daemon.api.status import StatusBoard, checkpoint_tiers


def _submit(buffer: int = 64):
    send, recv = trio.open_memory_channel(buffer)
    return Submit("r1", tuple(range(100)), None, Sampling(max_tokens=4), False, send, RequestControl()), recv


async def _drain(recv) -> list:
    out = []
    while True:
        try:
            out.append(recv.receive_nowait())
        except trio.WouldBlock:
            return out


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


async def test_progress_is_throttled_first_always_goes_out(autojump_clock):
    sub, recv = _submit()
    rep = ProgressReporter(sub, total=1000, reused=100, min_interval_s=0.25)
    rep.begin()
    await trio.sleep(0.1)
    rep.segment_done(200)                      # 0.1 s after the first: dropped
    await trio.sleep(0.2)
    rep.segment_done(300)                      # 0.3 s: sent, with an ETA from the rate so far
    got = await _drain(recv)
    assert [(p.done, p.total) for p in got] == [(100, 1000), (300, 1000)]
    assert got[0].eta_s is None and got[0].request_id == "r1"
    assert got[1].eta_s == pytest.approx((1000 - 300) * 0.3 / 200, abs=0.01)


async def test_progress_never_blocks_on_a_full_or_closed_channel(autojump_clock):
    sub, recv = _submit(buffer=1)
    rep = ProgressReporter(sub, total=10, reused=0, min_interval_s=0)
    rep.begin()                                # fills the one-slot buffer
    rep.segment_done(5)                        # buffer full: dropped at once, no error, no wait
    assert [p.done for p in await _drain(recv)] == [0]
    rep.segment_done(7)                        # room again: sent (so 5 was dropped, not queued)
    assert [p.done for p in await _drain(recv)] == [7]
    await recv.aclose()
    rep.segment_done(10)                       # handler gone: dropped, no error


def test_iter_sse_progress_data_done_and_error():
    lines = [": progress {\"done\": 64, \"total\": 600, \"eta_s\": 1.5}", "", ": keepalive",
             "data: {\"choices\": []}", "", "data: [DONE]", "data: {\"never\": 1}"]
    assert list(iter_sse(lines)) == [("progress", {"done": 64, "total": 600, "eta_s": 1.5}),
                                     ("comment", "keepalive"), ("data", {"choices": []})]
    with pytest.raises(ClientError, match="engine failed"):
        list(iter_sse(["data: {\"error\": {\"message\": \"engine failed\"}}"]))


def test_progress_display_lines_off_a_terminal_and_in_place_on_one():
    buf = io.StringIO()
    d = ProgressDisplay(buf, enabled=True)
    d.update({"done": 300, "total": 600, "eta_s": 2.0})
    d.clear()
    assert buf.getvalue() == progress_line({"done": 300, "total": 600, "eta_s": 2.0}) + "\n"
    assert "300/600 tokens" in buf.getvalue() and "50%" in buf.getvalue() and "eta 2.0s" in buf.getvalue()

    class TTY(io.StringIO):
        def isatty(self):
            return True
    t = TTY()
    d = ProgressDisplay(t)                      # auto: on, because it is a terminal
    d.update({"done": 1, "total": 2, "eta_s": None})
    d.clear()
    assert t.getvalue().startswith("\rprefill [") and t.getvalue().endswith("\r")
    off = io.StringIO()
    ProgressDisplay(off).update({"done": 1, "total": 2})   # auto and not a terminal: nothing
    assert off.getvalue() == ""


def test_checkpoint_table():
    rows = [{"id": "0ad9bc157df4a625", "tokens": 1822, "kind": "prompt_end", "bytes": 236025, "own_bytes": 36025,
             "shared_bytes": 200000, "tier": "memory", "hits": 3, "last_used": 1_800_000_000.0 - 75}]
    out = format_checkpoints(rows, now=1_800_000_000.0).splitlines()
    assert out[0].split() == ["ID", "TOKENS", "KIND", "BYTES", "OWN", "SHARED", "TIER", "HITS", "LAST", "USE"]
    assert out[1].split() == ["0ad9bc157df4a625", "1822", "prompt_end", "230.5", "KiB", "35.2", "KiB", "195.3", "KiB",
                              "memory", "3", "1m15s", "ago"]
    assert format_checkpoints([]) == "no checkpoints"


def test_status_board_tracks_the_running_request_and_formats():
    board = StatusBoard(queue_size=8, fingerprint="ab" * 32, context_length=4096)
    board.submitted("a", 600, 32)
    board.submitted("b", 10, 4)
    assert board.running() is None
    board.seen("a", Progress("a", 128, 600, 3.0))
    r = board.running()
    assert (r["id"], r["phase"], r["tokens_done"], r["tokens_total"]) == ("a", "prefill", 128, 600)
    board.seen("a", Started(0, None))
    board.seen("a", TokenOut(5, "x", 0.0, ()))
    r = board.running()
    assert (r["phase"], r["tokens_done"], r["tokens_total"]) == ("decode", 1, 32)
    s = board.snapshot("tiny")
    assert s["queue"] == {"depth": 1, "capacity": 8} and s["checkpoints"]["memory"] == {"count": 0, "bytes": 0}
    text = format_status(s)
    assert "model        tiny" in text and "running      a: decode 1/32" in text
    board.finished("a")
    board.finished("b")
    assert board.running() is None and "running      idle" in format_status(board.snapshot("tiny"))


def test_status_shows_the_reply_table():
    from cairn.daemon.protocol.reply_ids import ReplyTable

    table = ReplyTable(1 << 20)
    table.put(b"k", 7, [1, 2, 3])
    table.note_replayed(1, 3)
    s = StatusBoard(queue_size=8, replies=table).snapshot("tiny")
    assert s["replies"]["entries"] == 1 and s["replies"]["max_bytes"] == 1 << 20
    assert "replies      1 kept" in format_status(s) and "1 turn(s) replayed, 3 tokens" in format_status(s)
    assert StatusBoard().snapshot("tiny")["replies"] is None and "replies" not in format_status(
        StatusBoard().snapshot("tiny"))


def test_checkpoint_hook_reads_the_managers_stats():
    class Ck:
        def checkpoint_stats(self):
            return {"enabled": True, "memory": {"entries": 2, "bytes": 300, "max_bytes": 1000},
                    "disk": {"entries": 1, "bytes": 50}, "hits": 4}

    class Eng:
        checkpoints = Ck()
    t = checkpoint_tiers(Eng())
    assert t["memory"] == {"count": 2, "bytes": 300, "max_bytes": 1000} and t["disk"] == {"count": 1, "bytes": 50}
    assert t["hits"] == 4 and t["enabled"] is True
    assert checkpoint_tiers(None)["disk"] == {"count": 0, "bytes": 0}


def test_status_lists_what_each_slot_holds_and_does():
    import types

    slot = lambda i, rid, phase, n: types.SimpleNamespace(
        describe=lambda: {"slot": i, "request_id": rid, "phase": phase, "state_tokens": n})
    engine = types.SimpleNamespace(slots=[slot(0, "cmpl-a", "decode", 300), slot(1, None, "idle", 40)])
    s = StatusBoard(engine=engine, queue_size=8).snapshot("tiny")
    assert s["engine"]["slots"] == 2 and [x["phase"] for x in s["slots"]] == ["decode", "idle"]
    text = format_status(s)
    assert "slot 0       decode cmpl-a, state 300 tokens" in text and "slot 1       idle, state 40 tokens" in text
    assert StatusBoard(queue_size=8).snapshot("tiny")["slots"] == []


def test_status_lists_every_running_request_in_slot_mode():
    board = StatusBoard(queue_size=8, fingerprint="ab" * 32, context_length=4096)
    for rid in ("a", "b", "c"):
        board.submitted(rid, 100, 8)
    board.seen("a", Progress("a", 64, 100, 1.0))
    board.seen("b", Started(0, None))
    s = board.snapshot("tiny")
    assert {r["id"] for r in s["active"]} == {"a", "b"}          # c is still queued
    assert s["running"] == s["active"][0]
    text = format_status(s)
    assert "running      a: prefill 64/100" in text and "running      b: decode 0/8" in text
    board.finished("a")
    assert [r["id"] for r in board.snapshot("tiny")["active"]] == ["b"]


def test_the_cli_key_comes_from_the_flag_file_then_the_environment_and_is_sent(tmp_path):
    import argparse

    import pytest

    from cairn.daemon.cli.client import Client, ClientError, api_key

    f = tmp_path / "key"
    f.write_text("from-file\n")
    none = argparse.Namespace(api_key_file=None)
    assert api_key(none, {}) is None
    assert api_key(none, {"CAIRN_API_KEY": "from-env"}) == "from-env"
    assert api_key(none, {"CAIRN_API_KEY_FILE": str(f)}) == "from-file"
    assert api_key(argparse.Namespace(api_key_file=str(f)), {"CAIRN_API_KEY": "from-env"}) == "from-file"
    with pytest.raises(ClientError, match="API key file.*cannot read"):
        api_key(argparse.Namespace(api_key_file=str(tmp_path / "nope")), {})
    with Client(str(tmp_path / "s.sock"), api_key="k") as c:
        assert c.http.headers["authorization"] == "Bearer k"
    with Client(str(tmp_path / "s.sock")) as c:
        assert "authorization" not in c.http.headers


def test_status_shows_the_memory_plan_and_where_its_limit_came_from():
    from cairn.daemon.service.memory_plan import LimitSource, ModelBytes, StateCost, plan_memory

    cost = StateCost(("compressed_sparse_attention",), 16, 256, 16, 2, 16, 512)
    plan = plan_memory(limit=LimitSource("cgroup v2 memory.max", 160 << 20, 40 << 20, "/system.slice/cairn.service"),
                       weights=ModelBytes(4 << 20, 1 << 20), state=cost, context_length=65536,
                       checkpoint_setting=2048 << 20)
    s = StatusBoard(queue_size=8, memory_plan=plan).snapshot("tiny")
    got = s["memory"]["plan"]
    assert got["limit_bytes"] == 160 << 20 and got["room_bytes"] == 120 << 20 and got["slots"] == plan.slots
    assert got["parts"]["checkpoints"] == plan.checkpoint_bytes and got["reason"] == plan.reason
    text = format_status(s)
    assert "memory plan  room 120.0 MiB from cgroup v2 memory.max of /system.slice/cairn.service 160.0 MiB" in text
    assert "checkpoints " in text and "states " in text
    assert "memory plan" not in format_status(StatusBoard(queue_size=8).snapshot("tiny"))


def test_status_shows_the_expert_read_ahead_only_when_it_read_ahead():
    ex = {"paged": True, "budget_bytes": 1 << 20, "expert_bytes_total": 1 << 22, "slots": 4, "hit_rate": 0.5,
          "hits": 10, "misses": 10, "bytes_read": 1 << 21, "read_s": 0.1, "stall_s": 0.0}
    assert "read ahead" not in format_status({"expert_cache": ex})
    ahead = ex | {"prefetch_reads": 7, "prefetch_used": 5, "lookahead_guesses": 8, "lookahead_right": 6,
                  "lookahead_precision": 0.75}
    text = format_status({"expert_cache": ahead})
    assert "read ahead 7 (5 used); router lookahead right on 75.0% of 8 guesses" in text
