"""A daemon as a gateway's worker, in-process: the identification, metadata and load endpoints over HTTP,
and request fields a gateway adds being accepted."""

from __future__ import annotations

import trio
from structlog.testing import capture_logs

from daemon_harness import daemon, fake_loaded, request


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
