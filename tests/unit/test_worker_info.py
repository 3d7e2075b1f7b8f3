"""The gateway-facing endpoints' content (daemon/api/worker_info.py) and the status board's load figure."""

from __future__ import annotations

import datetime as dt

from cairn.actors.engine.messages import Progress, Started
from cairn.daemon.api import worker_info
from cairn.daemon.api.status import StatusBoard


class _Control:
    final = None


def test_load_counts_queued_and_running_requests_and_prompt_tokens_left_to_prefill():
    board = StatusBoard(queue_size=4, context_length=1000)
    board.submitted("a", 300, 10, _Control())
    board.submitted("b", 200, 10, _Control())
    board.submitted("c", 50, 10, _Control())
    board.seen("a", Progress("a", 120, 300, None))      # a: prefilling, 180 left
    board.seen("c", Started(0, None))                   # c: decoding, nothing left to prefill
    ended = _Control()
    ended.final = object()
    board.submitted("d", 999, 10, ended)                # ended by the engine, handler still writing
    assert board.load() == {"running": 2, "waiting": 1, "pending_prefill_tokens": 180 + 200,
                            "queued_prompt_tokens": 200, "live_tokens": 0}


def test_loads_answer_in_the_gateway_load_schema_one_rank():
    out = worker_info.loads(running=1, waiting=2, pending_prefill_tokens=500, queued_prompt_tokens=300,
                            live_tokens=256, context_length=1024,
                            max_running_requests=1, version="0.1.0",
                            now=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))
    assert out["dp_rank_count"] == 1 and out["timestamp"].startswith("2026-01-01")
    (rank,) = out["loads"]
    assert rank["num_running_reqs"] == 1 and rank["num_waiting_reqs"] == 2 and rank["num_total_reqs"] == 3
    assert rank["token_usage"] == 0.25 and rank["num_used_tokens"] == 256 and rank["max_total_num_tokens"] == 1024
    assert rank["pending_prefill_tokens"] == 500 and rank["num_waiting_uncached_tokens"] == 300
    assert rank["utilization"] == 1.0


def test_server_info_names_the_model_for_the_gateway_and_says_it_is_cairn():
    info = worker_info.server_info(model_id="m", context_length=4096, fingerprint="fp_x", version="0.1.0",
                                   max_running_requests=1, queue_size=8)
    assert info["served_model_name"] == "m" and info["model_path"] == "m"
    assert info["context_length"] == 4096 and info["max_running_requests"] == 1 and info["engine"] == "cairn"
    assert worker_info.model_info(model_id="m")["is_generation"] is True


def test_loads_with_slots_measure_capacity_and_utilization_over_every_slot():
    out = worker_info.loads(running=1, waiting=0, pending_prefill_tokens=0, queued_prompt_tokens=0,
                            live_tokens=512, context_length=1024, max_running_requests=4, version="0.1.0")
    (rank,) = out["loads"]
    assert rank["max_total_num_tokens"] == 4096 and rank["token_usage"] == 0.125
    assert rank["utilization"] == 0.25 and rank["max_running_requests"] == 4
    info = worker_info.server_info(model_id="m", context_length=1024, fingerprint="f", version="0.1.0",
                                   max_running_requests=4, queue_size=8)
    assert info["max_total_tokens"] == 4096 and info["context_length"] == 1024
