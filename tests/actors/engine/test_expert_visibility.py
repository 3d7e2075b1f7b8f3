"""Paged experts, daemon side (issue 12, item 4): the expert cache's work as deltas of the kernel's
cumulative counters around each kernel call, in the segment log line, the request log line,
/v1/status, `cairn status` and /metrics. The fake kernel's ExpertCache (tests/fake_kernel.py)
stands in for the real one: an LRU over (layer, expert) with the kernel's counter names."""

from __future__ import annotations

import trio
from structlog.testing import capture_logs

from cairn.actors.engine.expert_io import ExpertIO
from cairn.daemon.cli.client import format_status
from daemon_harness import daemon, fake_loaded, request

CACHE = dict(experts=16, layers=2, top_k=2, slots=6, expert_bytes=1000, read_s=0.002, stall_share=0.5)


def _body(prompt, n, **kw):
    return {"model": "tiny", "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, **kw}


def _sum(rows) -> ExpertIO:
    out = ExpertIO()
    for r in rows:
        out = out + ExpertIO(r["hits"], r["misses"], r["bytes_read"], r["read_s"], r["stall_s"], r["evictions"])
    return out


def _ints(io: ExpertIO) -> tuple:
    """The exact counters (times are rounded in the log lines)."""
    return io.hits, io.misses, io.bytes_read, io.evictions


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


async def test_segment_and_request_lines_carry_the_kernel_counters_deltas(tiny_model_dir, tmp_path):
    loaded = fake_loaded(tiny_model_dir, expert_cache=CACHE)
    sock = tmp_path / "c.sock"
    prompts = [list(range(20, 120)), list(range(300, 340))]
    with trio.fail_after(30), capture_logs() as events:
        async with daemon(loaded, sock, chunk=16, segment=32, checkpoints=False):
            for p in prompts:
                r = await request(sock, "POST", "/v1/completions", _body(p, 5))
                assert r.status == 200, r.body
            status = (await request(sock, "GET", "/v1/status")).json()
            metrics = (await request(sock, "GET", "/metrics")).body.decode()
    kernel = ExpertIO.from_stats(loaded.model.expert_cache_stats())
    assert kernel.misses > 0 and kernel.hits > 0 and kernel.evictions > 0     # the cache was exercised
    segs = [e for e in events if e["event"] == "prefill_segment"]
    reqs = [e for e in events if e["event"] == "request"]
    assert len(segs) == 4 + 2 and len(reqs) == 2                              # 100 = 4 segments of <= 32, 40 = 2
    # every segment names its own work; a request's prefill is the sum of its segments
    for req in reqs:
        mine = [s["experts"] for s in segs if s["request_id"] == req["request_id"]]
        assert all(m["hits"] + m["misses"] > 0 for m in mine)
        assert _ints(_sum(mine)) == _ints(_sum([req["experts"]["prefill"]]))
        assert req["experts"]["decode"]["hits"] + req["experts"]["decode"]["misses"] > 0   # 4 decode steps
    # requests ran one after the other: their deltas add up to the kernel's own counters exactly
    total = _sum([r["experts"][part] for r in reqs for part in ("prefill", "decode")])
    assert _ints(total) == _ints(kernel)
    assert total.bytes_read == kernel.misses * CACHE["expert_bytes"]
    seg = segs[0]["experts"]
    assert seg["hit_rate"] == round(seg["hits"] / (seg["hits"] + seg["misses"]), 4) and 0 <= seg["stall_frac"]
    # /v1/status and /metrics show the same totals, and the kernel's budget
    ex = status["expert_cache"]
    assert ex["paged"] is True and ex["budget_bytes"] == CACHE["slots"] * CACHE["expert_bytes"]
    assert (ex["hits"], ex["misses"], ex["bytes_read"]) == (kernel.hits, kernel.misses, kernel.bytes_read)
    assert ex["hit_rate"] == round(kernel.hits / (kernel.hits + kernel.misses), 4)
    assert _metric(metrics, "cairn_expert_cache_hits_total") == kernel.hits
    assert _metric(metrics, "cairn_expert_cache_misses_total") == kernel.misses
    assert _metric(metrics, "cairn_expert_cache_read_bytes_total") == kernel.bytes_read
    assert _metric(metrics, "cairn_expert_cache_evictions_total") == kernel.evictions
    assert _metric(metrics, "cairn_expert_cache_budget_bytes") == CACHE["slots"] * CACHE["expert_bytes"]
    assert abs(_metric(metrics, "cairn_expert_cache_stall_seconds_total") - kernel.stall_s) < 1e-9
    text = format_status(status)
    assert "experts      paged" in text and f"{kernel.hits} hits, {kernel.misses} misses" in text


async def test_batched_decode_steps_count_the_whole_step_for_each_request(tiny_model_dir, tmp_path):
    loaded = fake_loaded(tiny_model_dir, expert_cache=CACHE)
    sock = tmp_path / "c.sock"
    with trio.fail_after(30), capture_logs() as events:
        async with daemon(loaded, sock, slots=2, checkpoints=False):
            async with trio.open_nursery() as n:
                for p in ([7, 8, 9] * 5, [11, 12]):
                    n.start_soon(request, sock, "POST", "/v1/completions", _body(p, 12))
            status = (await request(sock, "GET", "/v1/status")).json()
    kernel = ExpertIO.from_stats(loaded.model.expert_cache_stats())
    assert ("decode_batch", 2) in loaded.model.calls
    reqs = [e for e in events if e["event"] == "request"]
    prefill = _sum([r["experts"]["prefill"] for r in reqs])
    decode = [_sum([r["experts"]["decode"]]) for r in reqs]
    # a shared step is counted for both requests, so the per-request decode sums exceed the kernel's
    # decode work, while the engine-wide totals (status) stay exactly the kernel's
    assert prefill.misses + max(d.misses for d in decode) <= kernel.misses <= prefill.misses + sum(d.misses for d in decode)
    assert (status["expert_cache"]["hits"], status["expert_cache"]["misses"]) == (kernel.hits, kernel.misses)


async def test_resident_experts_add_nothing_to_the_lines(tiny_model_dir, tmp_path):
    loaded = fake_loaded(tiny_model_dir)          # no expert cache: budget 0, every expert resident
    sock = tmp_path / "c.sock"
    with trio.fail_after(30), capture_logs() as events:
        async with daemon(loaded, sock):
            await request(sock, "POST", "/v1/completions", _body([5, 6, 7], 3))
            status = (await request(sock, "GET", "/v1/status")).json()
    assert not any("experts" in e for e in events if e["event"] in ("prefill_segment", "request"))
    assert status["expert_cache"]["paged"] is False and status["expert_cache"]["budget_bytes"] == 0
    assert "experts      all resident" in format_status(status)
