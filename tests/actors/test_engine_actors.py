"""Actor logic with the fake kernel (tests/fake_kernel.py): cancel handshake ordering, UTF-8 and
stop strings across token boundaries, seeded sampling, EOS, TCP API key."""

from __future__ import annotations

import socket

import trio
import trio.testing
from structlog.testing import capture_logs

from daemon_harness import daemon, fake_loaded, open_request, request, wait_for_event
from gated_kernel import Gate, gated


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_cancel_ack_before_next_admission_and_kernel_stops_within_one_chunk(tiny_model_dir, tmp_path):
    """The fake kernel is held at a chunk boundary (gate) when the client leaves: no further chunk
    runs, and the cancel is acknowledged before the queued request is admitted."""
    loaded = fake_loaded(tiny_model_dir)
    gate = Gate(permits=5)
    sock = tmp_path / "c.sock"
    with trio.fail_after(30), capture_logs() as events:
        async with daemon(gated(loaded, gate), sock, chunk=4, segment=4096):
            a = await open_request(sock, "POST", "/v1/completions", {"model": "tiny", "prompt": [7] * 400})
            await gate.wait_blocked()
            async with trio.open_nursery() as n:
                res = {}

                async def b():
                    res["b"] = await request(sock, "POST", "/v1/completions",
                                             {"model": "tiny", "prompt": [9] * 8, "max_tokens": 2})
                n.start_soon(b)
                await trio.testing.wait_all_tasks_blocked()          # b waits in the queue
                await a.aclose()
                ack = await wait_for_event(events, lambda e: e["event"] == "prefill_cancelled")
                chunks_at_ack = gate.count("prefill_chunk")
                gate.allow(None)
    order = [e["event"] for e in events if e["event"] in ("prefill_plan", "prefill_cancelled")]
    assert order == ["prefill_plan", "prefill_cancelled", "prefill_plan"]
    assert chunks_at_ack == 5 and ack["state_tokens"] == 5 * 4       # not one chunk after the disconnect
    assert res["b"].status == 200


async def test_utf8_across_tokens_and_stop_string_in_stream(tiny_model_dir, tmp_path):
    loaded = fake_loaded(tiny_model_dir)
    tok = loaded.tokenizer
    text = "héllo ✓ wörld END after"
    # byte-level tokens: one token per byte, so multi-byte characters span several tokens
    byte_tok = {}
    for i in range(loaded.model.vocab_size):
        b = tok.token_bytes(i)
        if len(b) == 1:
            byte_tok.setdefault(b, i)
    script = [byte_tok[bytes([c])] for c in text.encode()]
    prompt = [30, 31, 32]
    loaded.model.script, loaded.model.script_after = script, len(prompt)
    sock = tmp_path / "c.sock"
    with trio.fail_after(30), capture_logs():
        async with daemon(loaded, sock):
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 40, "temperature": 0, "stop": ["END"]}
            r = await request(sock, "POST", "/v1/completions", {**body, "stream": True})
            full = (await request(sock, "POST", "/v1/completions", body)).json()
    events = r.events()
    assert events[-1] == "[DONE]"
    streamed = "".join(e["choices"][0]["text"] for e in events[:-1])
    assert streamed == "héllo ✓ wörld " == full["choices"][0]["text"]
    assert "\ufffd" not in streamed
    assert events[-2]["choices"][0]["finish_reason"] == "stop" and full["choices"][0]["finish_reason"] == "stop"


async def test_seeded_sampling_repeats_and_eos_stops(tiny_model_dir, tmp_path):
    loaded = fake_loaded(tiny_model_dir)
    sock = tmp_path / "c.sock"
    body = {"model": "tiny", "prompt": [40, 41], "max_tokens": 12, "temperature": 1.0, "top_p": 0.9, "top_k": 50}
    with trio.fail_after(30), capture_logs():
        async with daemon(loaded, sock):
            a = (await request(sock, "POST", "/v1/completions", {**body, "seed": 1})).json()
            b = (await request(sock, "POST", "/v1/completions", {**body, "seed": 1})).json()
            c = (await request(sock, "POST", "/v1/completions", {**body, "seed": 2})).json()
            loaded.model.script, loaded.model.script_after = [50, 51, loaded.tokenizer.eos_id], 2
            d = (await request(sock, "POST", "/v1/completions",
                               {"model": "tiny", "prompt": [40, 41], "max_tokens": 12, "temperature": 0})).json()
    assert a["choices"][0]["text"] == b["choices"][0]["text"] != c["choices"][0]["text"]
    assert d["choices"][0]["finish_reason"] == "stop" and d["usage"]["completion_tokens"] == 3


async def test_tcp_requires_api_key_unix_socket_does_not(tiny_model_dir, tmp_path):
    import httpx

    loaded = fake_loaded(tiny_model_dir)
    sock = tmp_path / "c.sock"
    port = _free_port()
    with trio.fail_after(30), capture_logs():
        async with daemon(loaded, sock, tcp=f"127.0.0.1:{port}", api_key="sekrit"):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
                assert (await c.get("/v1/models")).status_code == 401
                ok = await c.get("/v1/models", headers={"Authorization": "Bearer sekrit"})
                assert ok.status_code == 200
            assert (await request(sock, "GET", "/v1/models")).status == 200


async def test_served_model_name_and_other_model_404(tiny_model_dir, tmp_path):
    loaded = fake_loaded(tiny_model_dir)
    sock = tmp_path / "c.sock"
    with trio.fail_after(30), capture_logs():
        async with daemon(loaded, sock, served_model_name="deepseek-v4-local"):
            models = (await request(sock, "GET", "/v1/models")).json()
            wrong = await request(sock, "POST", "/v1/completions", {"model": "tiny", "prompt": [5], "max_tokens": 1})
            right = await request(sock, "POST", "/v1/completions",
                                  {"model": "deepseek-v4-local", "prompt": [5], "max_tokens": 1})
    assert [m["id"] for m in models["data"]] == ["deepseek-v4-local"]
    # OpenAI's and Anthropic's model objects in one: the context's limits for clients that read them
    card = models["data"][0]
    assert card["object"] == card["type"] == "model" and card["display_name"] == "deepseek-v4-local"
    assert card["max_input_tokens"] == card["max_tokens"] == loaded.context_length - 1
    assert card["max_model_len"] == loaded.context_length and card["created_at"].endswith("Z")
    assert models["first_id"] == models["last_id"] == "deepseek-v4-local" and models["has_more"] is False
    assert wrong.status == 404 and wrong.json()["error"]["code"] == "model_not_found"
    assert right.status == 200 and right.json()["model"] == "deepseek-v4-local"


async def test_streamed_chat_logprobs_match_non_streamed(tiny_model_dir, tmp_path):
    loaded = fake_loaded(tiny_model_dir)
    sock = tmp_path / "c.sock"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "temperature": 0,
            "logprobs": True, "top_logprobs": 3}
    with trio.fail_after(30), capture_logs():
        async with daemon(loaded, sock):
            full = (await request(sock, "POST", "/v1/chat/completions", body)).json()
            stream = (await request(sock, "POST", "/v1/chat/completions", {**body, "stream": True})).events()
    entries = [e for ev in stream[:-1] if ev["choices"] and ev["choices"][0]["logprobs"]
               for e in ev["choices"][0]["logprobs"]["content"]]
    assert entries == full["choices"][0]["logprobs"]["content"]
    assert len(entries) == 6 and all(len(e["top_logprobs"]) == 3 for e in entries)
    assert stream[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}


async def test_a_bug_in_a_handler_is_a_logged_500_and_the_daemon_keeps_serving(tiny_model_dir, tmp_path):
    import dataclasses

    loaded = fake_loaded(tiny_model_dir)

    class BrokenRenderer:
        def render(self, *a, **kw):
            raise KeyError("bug in the renderer")

    broken = dataclasses.replace(loaded, renderer=BrokenRenderer())
    sock = tmp_path / "b.sock"
    with trio.fail_after(30), capture_logs() as events:
        async with daemon(broken, sock):
            r = await request(sock, "POST", "/v1/chat/completions",
                              {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
            assert r.status == 500 and r.json()["error"]["code"] == "internal_error"
            assert b"bug in the renderer" not in r.body and b"KeyError" not in r.body and b"Traceback" not in r.body
            ok = await request(sock, "POST", "/v1/completions", {"model": "tiny", "prompt": [5, 6], "max_tokens": 2})
            assert ok.status == 200
    failed = [e for e in events if e["event"] == "handler_failed" and e["log_level"] == "error"]
    assert failed and isinstance(failed[0]["exc_info"], KeyError)   # the traceback goes to the log
