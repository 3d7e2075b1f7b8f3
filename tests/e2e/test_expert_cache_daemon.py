"""The daemon serving a real paged model (`--expert-cache 25%` on the experts-fp4 preset): the budget
reaches the kernel, answers equal the resident daemon's, and the expert cache's work shows in the
segment and request log lines, /v1/status and /metrics with the kernel's own counters."""

from __future__ import annotations

import trio
from structlog.testing import capture_logs

from cairn.daemon.service.config import load_settings
from cairn.daemon.service.main import load
from daemon_harness import daemon, request


def _load(model_dir, tmp, expert_cache: str, **more):
    return load(load_settings({"model": str(model_dir), "threads": 2, "expert_cache": expert_cache,
                               "packed_cache_dir": str(tmp / "packed"), "checkpoint_dir": str(tmp / "state"),
                               **more}, {}))


def _body(prompt):
    return {"model": "experts-fp4", "prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True, "logprobs": 1}


async def test_paged_daemon_answers_as_the_resident_one_and_reports_the_cache(experts_dir, tmp_path):
    prompt = [int(t) for t in range(3, 300, 2)]
    with capture_logs() as load_events:
        paged = _load(experts_dir, tmp_path, "25%")
    resident = _load(experts_dir, tmp_path, "all")
    no_prefetch = _load(experts_dir, tmp_path, "25%", expert_prefetch="off")
    info = paged.model.expert_cache_info()
    assert info["prefetch"] is True and no_prefetch.model.expert_cache_info()["prefetch"] is False
    assert info["budget_bytes"] > 0 and resident.model.expert_cache_info()["budget_bytes"] == 0
    plan = [e for e in load_events if e["event"] == "memory_plan"][0]
    assert plan["paged"] and "25% of" in plan["reason"]
    out = {}
    for name, loaded in (("resident", resident), ("paged", paged), ("no_prefetch", no_prefetch)):
        sock = tmp_path / f"{name}.sock"
        with trio.fail_after(120), capture_logs() as events:
            async with daemon(loaded, sock, chunk=64, segment=64, checkpoints=False):
                r = await request(sock, "POST", "/v1/completions", _body(prompt))
                assert r.status == 200, r.body
                status = (await request(sock, "GET", "/v1/status")).json()
                metrics = (await request(sock, "GET", "/metrics")).body.decode()
        out[name] = (r.json()["choices"][0], events, status, metrics)
    for name in ("paged", "no_prefetch"):  # reading ahead changes which reads happen when, never a bit
        assert out[name][0]["text"] == out["resident"][0]["text"]
        assert out[name][0]["logprobs"]["token_logprobs"] == out["resident"][0]["logprobs"]["token_logprobs"]
    assert no_prefetch.model.expert_cache_stats()["prefetch_reads"] == 0
    _, events, status, metrics = out["paged"]
    kernel = paged.model.expert_cache_stats()
    segs = [e["experts"] for e in events if e["event"] == "prefill_segment"]
    req = [e for e in events if e["event"] == "request"][0]["experts"]
    assert len(segs) == 3 and all(s["misses"] > 0 for s in segs)
    assert sum(s["misses"] for s in segs) == req["prefill"]["misses"]
    assert req["prefill"]["misses"] + req["decode"]["misses"] == kernel["misses"]
    assert req["prefill"]["bytes_read"] + req["decode"]["bytes_read"] == kernel["bytes_read"]
    ex = status["expert_cache"]
    assert ex["paged"] and ex["budget_bytes"] == info["budget_bytes"] and ex["misses"] == kernel["misses"]
    assert f"cairn_expert_cache_read_bytes_total {kernel['bytes_read']}" in metrics
    # the read-ahead's work: in the kernel's counters, the request's line, /v1/status and /metrics
    assert kernel["lookahead_guesses"] > 0 and kernel["bytes_read"] == (
        kernel["misses"] + kernel["prefetch_reads"] - kernel["prefetch_dropped"]) * info["slot_bytes"]
    assert req["prefill"]["lookahead_guesses"] + req["decode"]["lookahead_guesses"] == kernel["lookahead_guesses"]
    assert (ex["prefetch_reads"], ex["lookahead_right"]) == (kernel["prefetch_reads"], kernel["lookahead_right"])
    assert f"cairn_expert_lookahead_guesses_total {kernel['lookahead_guesses']}" in metrics
    assert f"cairn_expert_prefetch_reads_total {kernel['prefetch_reads']}" in metrics
    _, events_r, status_r, _ = out["resident"]
    assert status_r["expert_cache"]["paged"] is False
    assert not any("experts" in e for e in events_r if e["event"] in ("prefill_segment", "request"))


def test_a_budget_below_the_kernels_minimum_is_a_start_error_naming_the_setting(experts_dir, tmp_path):
    import pytest

    from cairn.daemon.service.config import ConfigError

    with pytest.raises(ConfigError) as e:
        _load(experts_dir, tmp_path, "4K")
    msg = str(e.value)
    assert msg.startswith("setting 'expert_cache' (4K)") and "minimum" in msg
