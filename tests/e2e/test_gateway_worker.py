"""A daemon as a gateway's worker, in-process: the identification, metadata and load endpoints over HTTP,
and request fields a gateway adds being accepted."""

from __future__ import annotations

import trio
from structlog.testing import capture_logs

from daemon_harness import daemon, fake_loaded, open_request, request
from gated_kernel import Gate, gated


async def test_gateway_probes_answer_server_info_model_info_loads_and_no_version(tiny_model_dir, tmp_path):
    loaded = fake_loaded(tiny_model_dir)
    sock = tmp_path / "w.sock"
    with trio.fail_after(30), capture_logs():
        async with daemon(loaded, sock, served_model_name="tiny"):
            info = await request(sock, "GET", "/server_info")
            model = await request(sock, "GET", "/model_info")
            loads = await request(sock, "GET", "/v1/loads?include=core,disagg,queues,memory")
            models = await request(sock, "GET", "/v1/models")
            version = await request(sock, "GET", "/version")
    assert info.status == 200 and info.json()["served_model_name"] == "tiny"
    assert info.json()["context_length"] == loaded.context_length
    assert model.status == 200 and model.json()["model_path"] == "tiny"
    assert loads.status == 200
    (rank,) = loads.json()["loads"]
    assert rank["num_running_reqs"] == 0 and rank["num_waiting_reqs"] == 0
    assert models.json()["data"][0]["owned_by"] == "cairn"
    # /version would make SMG take cairn for vLLM (daemon/api/worker_info.py): it stays unanswered
    assert version.status == 404


async def test_server_info_and_loads_report_one_running_request_per_slot(tiny_model_dir, tmp_path):
    loaded = fake_loaded(tiny_model_dir)
    sock = tmp_path / "w.sock"
    with trio.fail_after(30), capture_logs():
        async with daemon(loaded, sock, served_model_name="tiny", slots=3):
            info = await request(sock, "GET", "/server_info")
            loads = await request(sock, "GET", "/v1/loads?include=core")
    assert info.status == 200 and info.json()["max_running_requests"] == 3
    assert loads.status == 200 and loads.json()["loads"][0]["max_running_requests"] == 3


async def test_request_fields_a_gateway_forwards_are_accepted(tiny_model_dir, tmp_path):
    loaded = fake_loaded(tiny_model_dir)
    sock = tmp_path / "w.sock"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0,
            "rid": "r-1", "return_text_in_logprobs": True, "separate_reasoning": True, "no_stop_trim": False}
    with trio.fail_after(30), capture_logs():
        async with daemon(loaded, sock, served_model_name="tiny"):
            r = await request(sock, "POST", "/v1/chat/completions", body)
    assert r.status == 200, r.body
    assert r.json()["usage"]["completion_tokens"] == 2


async def test_with_two_slots_server_info_and_loads_count_both_slots(tiny_model_dir, tmp_path):
    # regression: with slots > 1 both routes answered 500 (the slot list taken for a number)
    loaded = fake_loaded(tiny_model_dir)
    gate = Gate(permits=0)
    sock = tmp_path / "w2.sock"
    body = {"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 30, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with trio.fail_after(30), capture_logs():
        async with daemon(gated(loaded, gate), sock, slots=2):
            idle = await request(sock, "GET", "/v1/loads")
            a = await open_request(sock, "POST", "/v1/completions", body)
            b = await open_request(sock, "POST", "/v1/completions", {**body, "prompt": [9, 10]})
            gate.allow(4)                                   # both prefills, then batched steps
            await gate.wait_blocked()
            info = await request(sock, "GET", "/server_info")
            loads = await request(sock, "GET", "/v1/loads")
            status = (await request(sock, "GET", "/v1/status")).json()
            await a.aclose()
            await b.aclose()
            gate.allow(None)
    assert info.status == 200 and loads.status == 200 and idle.status == 200, (info.body, loads.body)
    ctx = loaded.context_length
    assert info.json()["max_running_requests"] == 2 and info.json()["max_total_tokens"] == 2 * ctx
    (rank,) = idle.json()["loads"]
    assert rank["num_running_reqs"] == 0 and rank["utilization"] == 0.0 and rank["max_running_requests"] == 2
    (rank,) = loads.json()["loads"]
    live = sum(s["state_tokens"] for s in status["slots"])
    assert rank["num_running_reqs"] == 2 and rank["num_waiting_reqs"] == 0 and rank["utilization"] == 1.0
    assert rank["max_total_num_tokens"] == 2 * ctx and live > 0
    assert rank["num_used_tokens"] == live
    assert rank["token_usage"] == round(live / (2 * ctx), 6)
