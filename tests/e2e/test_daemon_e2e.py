"""End to end: the real kernel on the tiny model, a real daemon on a real Unix socket.

Each test starts the daemon in-process (so its structured log lines can be captured and checked),
talks raw HTTP/1.1 or the official `openai` client over the socket, and runs under `fail_after`.
"""

from __future__ import annotations

import numpy as np
import pytest
import trio
import trio.testing
from structlog.testing import capture_logs

from daemon_harness import (daemon, open_request, real_loaded, reference_greedy, request,
                            token_strings, wait_for_event)
from gated_kernel import Gate, gated


RNG = np.random.default_rng(7)
LONG = [int(t) for t in RNG.integers(20, 500, size=12000)]   # several seconds of prefill on the tiny model


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return real_loaded(tiny_model_dir)


def _cmpl(prompt, **kw) -> dict:
    return {"model": "tiny", "prompt": prompt, "temperature": 0, "max_tokens": 3, "logprobs": 1, **kw}


def _events(events, name, **match):
    return [e for e in events if e["event"] == name and all(e.get(k) == v for k, v in match.items())]


async def test_two_requests_second_extends_first_reuses_live_state(loaded, tmp_path):
    sock = tmp_path / "c.sock"
    p1 = [int(t) for t in RNG.integers(20, 500, size=150)]
    with trio.fail_after(60), capture_logs():
        async with daemon(loaded, sock):
            r1 = (await request(sock, "POST", "/v1/completions", _cmpl(p1))).json()
            assert r1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            g = reference_greedy(loaded, p1, 3)
            assert r1["choices"][0]["logprobs"]["tokens"] == token_strings(loaded, g)
            # fed after turn 1: prompt + generated but the last
            p2 = p1 + g[:2] + [int(t) for t in RNG.integers(20, 500, size=40)]
            r2 = (await request(sock, "POST", "/v1/completions", _cmpl(p2))).json()
    assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] == len(p1) + 2
    assert r2["usage"]["prompt_tokens"] == len(p2)
    fresh = reference_greedy(loaded, p2, 3)
    assert r2["choices"][0]["logprobs"]["tokens"] == token_strings(loaded, fresh)


async def test_disconnect_during_prefill_stops_kernel_within_a_chunk_and_frees_engine(loaded, tmp_path):
    """The kernel is held at a chunk boundary (gate) when the client leaves: the cancel must reach it
    there -- not one more chunk runs -- and be acknowledged before the queued request is admitted."""
    sock = tmp_path / "c.sock"
    chunk, held_after = 32, 3
    gate = Gate(permits=held_after)
    with trio.fail_after(60), capture_logs() as events:
        async with daemon(gated(loaded, gate), sock, chunk=chunk):
            a = await open_request(sock, "POST", "/v1/completions", _cmpl(LONG))
            await gate.wait_blocked()                              # 3 chunks done, the 4th waits
            b_result = {}

            async def second():
                b_result["r"] = await request(sock, "POST", "/v1/completions", _cmpl(LONG[:50]))

            async with trio.open_nursery() as n:
                n.start_soon(second)
                await trio.testing.wait_all_tasks_blocked()        # the second one waits in the queue
                queued = _events(events, "prefill_plan")
                await a.aclose()                                   # the client goes away mid-prompt
                ack = await wait_for_event(events, lambda e: e["event"] == "prefill_cancelled")
                chunks_at_ack = gate.count("prefill_chunk")
                gate.allow(None)                                   # the second request may run now
            names = [e["event"] for e in events]
    assert len(queued) == 1                                        # b was waiting, not planned
    # the kernel stopped where it was held: no chunk ran after the disconnect
    assert chunks_at_ack == held_after and ack["state_tokens"] == held_after * chunk
    # cancel acknowledged before the next request was admitted
    plans = [i for i, e in enumerate(events) if e["event"] == "prefill_plan"]
    cancelled = names.index("prefill_cancelled")
    assert plans[0] < cancelled < plans[1]
    assert _events(events, "request", outcome="cancelled")
    body = b_result["r"].json()
    assert b_result["r"].status == 200
    assert body["choices"][0]["logprobs"]["tokens"] == token_strings(loaded, reference_greedy(loaded, LONG[:50], 3))


async def test_identical_retry_after_cancelled_prefill_resumes(loaded, tmp_path):
    sock = tmp_path / "c.sock"
    prompt = LONG[:5000]
    chunk, held_after = 64, 19                     # past the first 1024-token segment, mid-way in the second
    gate = Gate(permits=held_after)
    with trio.fail_after(60), capture_logs() as events:
        async with daemon(gated(loaded, gate), sock, chunk=chunk, segment=1024):
            a = await open_request(sock, "POST", "/v1/completions", _cmpl(prompt))
            await gate.wait_blocked()
            await a.aclose()
            ack = await wait_for_event(events, lambda e: e["event"] == "prefill_cancelled")
            gate.allow(None)
            r = (await request(sock, "POST", "/v1/completions", _cmpl(prompt))).json()
    done = ack["state_tokens"]
    assert done == held_after * chunk
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == done
    line = _events(events, "request", outcome="done")[-1]
    assert line["computed_tokens"] == len(prompt) - done and line["reused_tokens"] == done
    assert r["choices"][0]["logprobs"]["tokens"] == token_strings(loaded, reference_greedy(loaded, prompt, 3))


async def test_disconnect_during_decode_cancels_and_next_request_is_correct(loaded, tmp_path):
    """The kernel is held inside a decode step when the client leaves: that step is the last one."""
    sock = tmp_path / "c.sock"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "write a long story"}],
            "max_tokens": 20000, "stream": True, "temperature": 0, "ignore_eos": True}
    gate = Gate()
    with trio.fail_after(60), capture_logs() as events:
        async with daemon(gated(loaded, gate), sock):
            s = await open_request(sock, "POST", "/v1/chat/completions", body)
            got = b""
            # the role chunk, then four tokens: the engine has produced at least four whether or not
            # it is ahead of the client (its decode step loop runs beside the request's task)
            while got.count(b"data: ") < 5:
                got += await s.receive_some(65536)
            gate.hold()
            await gate.wait_blocked()                              # a decode step is in flight, held
            steps_before = gate.count("decode")
            await s.aclose()
            await trio.testing.wait_all_tasks_blocked()           # the daemon has seen the disconnect
            gate.allow(None)
            line = await wait_for_event(events, lambda e: e["event"] == "request")
            steps_after = gate.count("decode") - steps_before
            p = [int(t) for t in RNG.integers(20, 500, size=30)]
            r = (await request(sock, "POST", "/v1/completions", _cmpl(p))).json()
    assert line["outcome"] == "cancelled" and line["completion_tokens"] >= 4
    assert steps_after == 1, f"{steps_after} decode steps ran after the client left (only the held one may)"
    assert r["choices"][0]["logprobs"]["tokens"] == token_strings(loaded, reference_greedy(loaded, p, 3))


async def test_a_kernel_fault_inside_a_decode_step_fails_that_request_alone(loaded, tmp_path):
    """A decode step that fails midway in the kernel (its fault hook, which fires only in a StepWorker
    step: after the layers wrote the state, before its token count advanced) ends that request, and
    only it: a 500 `engine_error` naming the error, or, streamed, an error event after the tokens
    already sent. The torn state is discarded, never extended: a prompt that extends what it held is
    computed from its first token (the prompt is shorter than a checkpoint) and answers exactly the
    reference, and the daemon serves on."""
    K = loaded.kernel
    sock = tmp_path / "c.sock"
    p = [int(t) for t in RNG.integers(20, 500, size=60)]
    want = reference_greedy(loaded, p, 6)
    p2 = p + want[:2] + [int(t) for t in RNG.integers(20, 500, size=10)]   # extends both failed states
    try:
        with trio.fail_after(60), capture_logs() as events:
            async with daemon(loaded, sock):
                K._fail_worker_step(2)                          # the third decode step fails
                r = await request(sock, "POST", "/v1/completions", _cmpl(p, max_tokens=6))
                fired = K._fail_worker_step()
                K._fail_worker_step(1)
                rs = await request(sock, "POST", "/v1/completions", _cmpl(p, max_tokens=6, stream=True))
                fired_streamed = K._fail_worker_step()
                again = await request(sock, "POST", "/v1/completions", _cmpl(p2, max_tokens=6))
    finally:
        K._fail_worker_step(-1)
    assert fired == -1 and fired_streamed == -1                 # each fired, in a worker step
    assert r.status == 500, r.body[:300]
    err = r.json()["error"]
    assert err["code"] == "engine_error" and "injected fault in a decode step" in err["message"]
    ev = rs.events()
    assert rs.status == 200
    assert ev[-1] == "[DONE]" and [e for e in ev[:-2] if "error" in e] == []
    assert ev[-2]["error"]["code"] == "engine_error" and "injected fault in a decode step" in ev[-2]["error"]["message"]
    streamed = [c["choices"][0]["logprobs"]["tokens"][0] for c in ev[:-2]]
    assert streamed == token_strings(loaded, want)[:2]         # the prefill's token and the first step's
    lines = _events(events, "request")
    assert [ln["outcome"] for ln in lines] == ["error", "error", "done"], lines
    assert again.status == 200
    a = again.json()
    assert a["choices"][0]["logprobs"]["tokens"] == token_strings(loaded, reference_greedy(loaded, p2, 6))
    assert a["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


async def test_disconnect_while_queued_and_queue_full_429(loaded, tmp_path):
    sock = tmp_path / "c.sock"
    gate = Gate(permits=2)
    with trio.fail_after(60), capture_logs() as events:
        async with daemon(gated(loaded, gate), sock, queue_size=1, chunk=32):
            a = await open_request(sock, "POST", "/v1/completions", _cmpl(LONG))
            await gate.wait_blocked()                              # a holds the engine, mid-prompt
            b = await open_request(sock, "POST", "/v1/completions", _cmpl(LONG[:20]))
            await trio.testing.wait_all_tasks_blocked()           # b is waiting in the queue
            full = await request(sock, "POST", "/v1/completions", _cmpl(LONG[:10]))
            assert full.status == 429 and int(full.headers["retry-after"]) >= 1
            assert full.json()["error"]["code"] == "queue_full"
            await b.aclose()
            await trio.testing.wait_all_tasks_blocked()
            # b left the queue without the kernel moving: a is still held where it was
            assert len(_events(events, "cancelled_while_queued")) == 1 and gate.count("prefill_chunk") == 2
            # the queue has room again while a still runs: c is queued, not rejected
            c = await open_request(sock, "POST", "/v1/completions", _cmpl(LONG[:10]))
            await trio.testing.wait_all_tasks_blocked()
            assert len(_events(events, "rejected")) == 1           # only the 429 above
            await a.aclose()
            await wait_for_event(events, lambda e: e["event"] == "prefill_cancelled")
            gate.allow(None)
            data = b""
            while chunk_ := await c.receive_some(65536):
                data += chunk_
            assert data.startswith(b"HTTP/1.1 200")
    # b never reached the engine
    assert len(_events(events, "prefill_plan")) == 2


async def test_openai_client_over_unix_socket(loaded, tmp_path):
    import httpx
    import openai

    sock = tmp_path / "c.sock"
    with trio.fail_after(60), capture_logs():
        async with daemon(loaded, sock):
            msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello!"}]

            def use_client():
                client = openai.OpenAI(base_url="http://localhost/v1", api_key="unused",
                                       http_client=httpx.Client(transport=httpx.HTTPTransport(uds=str(sock))))
                models = client.models.list()
                full = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=5, temperature=0,
                                                      logprobs=True, top_logprobs=2)
                chunks = list(client.chat.completions.create(model="tiny", messages=msgs, max_tokens=5,
                                                             temperature=0, stream=True,
                                                             stream_options={"include_usage": True}))
                return models, full, chunks

            models, full, chunks = await trio.to_thread.run_sync(use_client)
    # the expected answer, from the kernel directly on the rendered prompt
    ids = loaded.tokenizer.encode(loaded.renderer.render(msgs).text)
    want = reference_greedy(loaded, ids, 5)
    assert loaded.tokenizer.eos_id not in want                  # so all 5 tokens are answered
    assert [m.id for m in models.data] == ["tiny"]
    assert full.choices[0].finish_reason == "length"
    assert full.usage.prompt_tokens == len(ids) and full.usage.completion_tokens == 5
    assert [c.token for c in full.choices[0].logprobs.content] == token_strings(loaded, want)
    assert all(len(c.top_logprobs) == 2 for c in full.choices[0].logprobs.content)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    # The live state has run past this prompt (prompt + 4 answer tokens) and cannot be rewound, and the
    # prompt is far below checkpoint_min_tokens (512): nothing is reusable.
    assert len(ids) < 512
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 0


def _log_softmax64(rows: np.ndarray) -> np.ndarray:
    """Independent of cairn.actors.decoding.sampling: float64, max-shifted."""
    x = rows.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


async def test_completions_echo_logprobs_match_kernel_logits(loaded, tmp_path):
    sock = tmp_path / "c.sock"
    p = [int(t) for t in RNG.integers(20, 500, size=60)]
    with trio.fail_after(60), capture_logs():
        async with daemon(loaded, sock):
            # a first request builds a live state the echo request could reuse: it must not
            await request(sock, "POST", "/v1/completions", _cmpl(p[:30], max_tokens=1))
            r = (await request(sock, "POST", "/v1/completions",
                               _cmpl(p, echo=True, logprobs=3, max_tokens=0))).json()
    lp = r["choices"][0]["logprobs"]
    k = loaded.kernel
    _, rows = k.prefill(k.State(loaded.model), np.asarray(p, dtype=np.int32), chunk=128, all_logits=True)
    want = _log_softmax64(rows)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    got = np.asarray(lp["token_logprobs"][1:])
    np.testing.assert_allclose(got, [want[i - 1, p[i]] for i in range(1, len(p))], atol=1e-5, rtol=0)
    assert lp["tokens"] == token_strings(loaded, p) and r["choices"][0]["finish_reason"] == "length"
    assert r["usage"]["completion_tokens"] == 0 and r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    for i in (1, 5, 59):                         # the top-3 after position i-1: tokens and values
        top = np.argsort(-want[i - 1])[:3]
        assert lp["top_logprobs"][i] == pytest.approx(dict(zip(token_strings(loaded, [int(t) for t in top]),
                                                               want[i - 1, top].tolist())), abs=1e-5)


async def test_metrics_count_reused_and_computed_tokens(loaded, tmp_path):
    sock = tmp_path / "c.sock"
    p1 = [int(t) for t in RNG.integers(20, 500, size=100)]
    with trio.fail_after(60), capture_logs():
        async with daemon(loaded, sock):
            r1 = (await request(sock, "POST", "/v1/completions", _cmpl(p1, max_tokens=1))).json()
            await request(sock, "POST", "/v1/completions", _cmpl(p1 + [30, 31], max_tokens=1))
            m = await request(sock, "GET", "/metrics")
    text = m.body.decode()
    assert m.status == 200 and m.headers["content-type"].startswith("text/plain")
    assert 'cairn_prefill_tokens_total{kind="reused"} 100' in text
    assert 'cairn_prefill_tokens_total{kind="computed"} 102' in text
    assert 'cairn_requests_total{outcome="done"} 2' in text
    assert "cairn_live_state_tokens 102" in text
    assert r1["usage"]["completion_tokens"] == 1


async def test_no_max_tokens_generates_to_the_end_of_the_context_unless_the_operator_caps_it(loaded, tmp_path):
    """aider and other agents send no max_tokens: the reply may use the rest of the context (as vLLM
    does), not a fixed 1024; an operator's max_tokens_default still caps it."""
    import dataclasses

    # a context the test can fill quickly, yet whose room is past the old fixed default of 1024
    small = dataclasses.replace(loaded, context_length=1100)
    prompt = [int(t) for t in RNG.integers(20, 500, size=60)]
    body = {"model": "tiny", "prompt": prompt, "temperature": 0, "ignore_eos": True}
    chat = {"model": "tiny", "temperature": 0, "ignore_eos": True, "messages": [{"role": "user", "content": "Hi"}]}
    with trio.fail_after(60), capture_logs():
        async with daemon(small, tmp_path / "a.sock"):
            r = (await request(tmp_path / "a.sock", "POST", "/v1/completions", body)).json()
            c = (await request(tmp_path / "a.sock", "POST", "/v1/chat/completions", chat)).json()
        async with daemon(small, tmp_path / "b.sock", max_tokens_default=5):
            capped = (await request(tmp_path / "b.sock", "POST", "/v1/completions", body)).json()
    assert r["usage"]["completion_tokens"] == 1100 - 60 and r["choices"][0]["finish_reason"] == "length"
    u = c["usage"]
    assert u["prompt_tokens"] + u["completion_tokens"] == 1100 and c["choices"][0]["finish_reason"] == "length"
    assert capped["usage"]["completion_tokens"] == 5
