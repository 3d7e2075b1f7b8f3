"""Several slots (--slots > 1): several requests in the engine at once, decode steps batched, prefill
chunk by chunk in between (fake kernel through the permit gate: the test sets the kernel's pace)."""

from __future__ import annotations

import trio
import trio.testing
from structlog.testing import capture_logs

from daemon_harness import daemon, fake_loaded, open_request, request, wait_for_event
from gated_kernel import Gate, gated


def _body(prompt, n, **kw):
    return {"model": "tiny", "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, **kw}


BATCHED = ("decode_batch", "verify_batch")    # a step of several sequences (with drafts or not)


def _batched(calls, rows: int | None = None) -> int:
    """The batched steps among kernel `calls` (of `rows` sequences, when given)."""
    return sum(1 for k, n in calls if k in BATCHED and (rows is None or n == rows))


def _text(resp) -> str:
    assert resp.status == 200, resp.body
    return resp.json()["choices"][0]["text"]


async def test_two_concurrent_streams_produce_what_each_produces_alone(tiny_model_dir, tmp_path):
    loaded = fake_loaded(tiny_model_dir)
    sock = tmp_path / "c.sock"
    a_body = _body([7, 8, 9] * 5, 24)
    b_body = _body([11, 12], 16, temperature=0.9, seed=5)
    with trio.fail_after(30), capture_logs() as events:
        async with daemon(loaded, sock, slots=2):
            alone_a = _text(await request(sock, "POST", "/v1/completions", a_body))
            alone_b = _text(await request(sock, "POST", "/v1/completions", b_body))
            loaded.model.calls.clear()
            res = {}
            async with trio.open_nursery() as n:
                async def go(key, body):
                    res[key] = _text(await request(sock, "POST", "/v1/completions", body))
                n.start_soon(go, "a", a_body)
                n.start_soon(go, "b", b_body)
    assert res == {"a": alone_a, "b": alone_b}
    assert _batched(loaded.model.calls, 2)                      # they really shared decode steps
    slots = {e["request_id"]: e["slot"] for e in events if e["event"] == "request"}
    assert sorted(set(slots.values())) == [0, 1]                # the log line names the slot


async def test_cancel_mid_decode_leaves_the_other_stream_unchanged(tiny_model_dir, tmp_path):
    loaded = fake_loaded(tiny_model_dir)
    gate = Gate(permits=0)
    sock = tmp_path / "c.sock"
    b_body = _body([21, 22, 23], 14)
    with trio.fail_after(30), capture_logs() as events:
        async with daemon(gated(loaded, gate), sock, slots=2):
            a = await open_request(sock, "POST", "/v1/completions", _body([5] * 6, 40, stream=True))
            res = {}
            async with trio.open_nursery() as n:
                async def b():
                    res["b"] = _text(await request(sock, "POST", "/v1/completions", b_body))
                n.start_soon(b)
                gate.allow(6)                                   # both prefills, then batched steps
                await gate.wait_blocked()
                assert _batched(gate.calls) >= 2 and _batched(gate.calls, 2)
                status = (await request(sock, "GET", "/v1/status")).json()
                metrics = (await request(sock, "GET", "/metrics")).body.decode()
                await a.aclose()                                # A's client leaves mid-answer
                # the step A may be in finishes first (a cancel never tears a step), then A is acked
                gate.allow(None)
                ack = await wait_for_event(events, lambda e: e["event"] == "request" and e["outcome"] == "cancelled")
            alone_b = _text(await request(sock, "POST", "/v1/completions", b_body))
    assert res["b"] == alone_b
    assert 4 <= ack["completion_tokens"] < 40
    assert status["engine"]["slots"] == 2
    assert [(s["slot"], s["phase"]) for s in status["slots"]] == [(0, "decode"), (1, "decode")]
    assert all(s["request_id"] and s["state_tokens"] > 0 for s in status["slots"])
    assert 'cairn_slots{phase="decode"} 2' in metrics and "cairn_decode_step_rows_total" in metrics


async def test_cancel_mid_prefill_leaves_the_other_stream_unchanged(tiny_model_dir, tmp_path):
    loaded = fake_loaded(tiny_model_dir)
    gate = Gate(permits=3)
    sock = tmp_path / "c.sock"
    b_body = _body([31, 32, 33, 34, 35], 10)
    with trio.fail_after(30), capture_logs() as events:
        async with daemon(gated(loaded, gate), sock, slots=2, chunk=4, segment=4):
            a = await open_request(sock, "POST", "/v1/completions", _body([6] * 400, 4))
            await gate.wait_blocked()                           # A is mid-prefill
            res = {}
            async with trio.open_nursery() as n:
                async def b():
                    res["b"] = _text(await request(sock, "POST", "/v1/completions", b_body))
                n.start_soon(b)
                await trio.testing.wait_all_tasks_blocked()
                gate.allow(4)
                await gate.wait_blocked()
                await a.aclose()
                ack = await wait_for_event(events, lambda e: e["event"] == "prefill_cancelled")
                gate.allow(None)
            alone_b = _text(await request(sock, "POST", "/v1/completions", b_body))
    assert res["b"] == alone_b
    assert 0 < ack["state_tokens"] < 400


async def test_side_request_completes_while_a_long_prefill_runs(tiny_model_dir, tmp_path):
    """Shortest remaining prefill first: a 20-token side request (5 chunks of 4) needs its own 5
    chunks, one decode step and the two chunks of the long prefill that come between -- 8 kernel
    calls, not the long prompt's 1000 chunks (one slot) nor 11 (round robin)."""
    loaded = fake_loaded(tiny_model_dir)
    gate = Gate(permits=1)
    sock = tmp_path / "c.sock"
    with trio.fail_after(30), capture_logs() as events:
        async with daemon(gated(loaded, gate), sock, slots=2, chunk=4, segment=4, checkpoints=False):
            long = await open_request(sock, "POST", "/v1/completions", _body([3] * 4000, 1))
            await gate.wait_blocked()                           # the long prefill holds the kernel
            res = {}
            async with trio.open_nursery() as n:
                async def side():
                    res["side"] = await request(sock, "POST", "/v1/completions", _body([40 + i for i in range(20)], 2))
                n.start_soon(side)
                await wait_for_event(events, lambda e: e["event"] == "prefill_plan" and e["prompt_tokens"] == 20)
                await trio.testing.wait_all_tasks_blocked()     # the side prefill waits for the kernel
                calls_before = len(gate.calls)
                gate.allow(8)
            assert _text(res["side"]) != ""
            side_calls = gate.calls[calls_before:]
            await long.aclose()
            gate.allow(None)
    # one decode step of one row (a one-row step is the kernel's `decode`: the same bits)
    steps = [c for c in side_calls if c[0] != "prefill_chunk"]
    assert len(steps) == 1 and steps[0][0] in ("decode", "verify") and not _batched(side_calls)
    assert sum(1 for k, n in side_calls if k == "prefill_chunk") <= 7     # 5 of its own + at most 2 of the long one


async def test_a_returning_conversation_finds_its_slot_and_a_new_one_takes_the_lru_slot(tiny_model_dir, tmp_path):
    loaded = fake_loaded(tiny_model_dir)
    sock = tmp_path / "c.sock"
    pa, pb, pc = [50 + i for i in range(12)], [80 + i for i in range(9)], [120 + i for i in range(7)]
    with trio.fail_after(30), capture_logs() as events:
        async with daemon(loaded, sock, slots=2, checkpoints=False):
            for prompt in (pa, pb, pa + [7, 8, 9], pc):
                # max_tokens 1: the state keeps exactly the prompt (the answer's last token is never fed)
                r = await request(sock, "POST", "/v1/completions", _body(prompt, 1))
                assert r.status == 200
            cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    lines = [e for e in events if e["event"] == "request"]
    assert [e["slot"] for e in lines] == [0, 1, 0, 1]     # A's follow-up back in slot 0; C in the LRU slot 1
    assert [e["reused_tokens"] for e in lines] == [0, 0, len(pa), 0] and cached == 0


async def test_a_kernel_error_in_a_batched_step_fails_its_requests_and_the_engine_keeps_serving(
        tiny_model_dir, tmp_path, monkeypatch):
    import fake_kernel

    loaded = fake_loaded(tiny_model_dir)
    real = fake_kernel.decode_batch
    calls = {"n": 0}

    def flaky(states, tokens, *, abort=None):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected kernel failure")
        return real(states, tokens, abort=abort)

    monkeypatch.setattr(fake_kernel, "decode_batch", flaky)
    sock = tmp_path / "c.sock"
    with trio.fail_after(30), capture_logs() as events:
        async with daemon(loaded, sock, slots=2):
            res = {}
            async with trio.open_nursery() as n:
                async def go(key, prompt):
                    res[key] = await request(sock, "POST", "/v1/completions", _body(prompt, 10))
                n.start_soon(go, "a", [1, 2, 3])
                n.start_soon(go, "b", [4, 5])
            after = await request(sock, "POST", "/v1/completions", _body([1, 2, 3], 10))
            status = (await request(sock, "GET", "/v1/status")).json()
    failed = [k for k, r in res.items() if r.status != 200]
    assert failed, "the injected failure reached no request"
    assert all("injected kernel failure" in res[k].json()["error"]["message"] for k in failed)
    outcomes = [e["outcome"] for e in events if e["event"] == "request"]
    assert outcomes.count("error") == len(failed) and outcomes[-1] == "done"
    assert after.status == 200 and [s["phase"] for s in status["slots"]] == ["idle", "idle"]


async def test_a_sequence_ready_while_a_prefill_chunk_holds_the_kernel_joins_the_next_decode_step(
        tiny_model_dir, tmp_path):
    """The decode step forms its batch once it has the kernel gate: C hands in its token while B's
    prefill chunk holds the kernel, D hands in its token after C; the step that follows B's chunk
    advances both. (A batch frozen before the gate was taken would run C alone, then D.)"""
    loaded = fake_loaded(tiny_model_dir)
    gate = Gate()
    sock = tmp_path / "c.sock"
    pc, pd = [60 + i for i in range(8)], [90 + i for i in range(8)]
    with trio.fail_after(30), capture_logs() as events:
        async with daemon(gated(loaded, gate), sock, slots=3, chunk=4, segment=4, checkpoints=False):
            for p in (pc, pd):   # slots 0 and 1 hold exactly these prompts (max_tokens 1: nothing fed)
                assert (await request(sock, "POST", "/v1/completions", _body(p, 1))).status == 200
            gate.hold()
            long = await open_request(sock, "POST", "/v1/completions", _body([3] * 400, 1))
            await gate.wait_blocked()                           # B's prefill chunk holds the kernel
            held_at = len(gate.calls)
            res = {}
            async with trio.open_nursery() as n:
                async def go(key, prompt):
                    res[key] = _text(await request(sock, "POST", "/v1/completions", _body(prompt, 3)))
                # C and D extend their slots' states without a kernel call: straight to decode
                n.start_soon(go, "c", pc)
                await _reuse_plans(events, 1)
                await trio.testing.wait_all_tasks_blocked()     # C's token waits for the kernel
                n.start_soon(go, "d", pd)
                await _reuse_plans(events, 2)
                await trio.testing.wait_all_tasks_blocked()     # D's too
                assert len(gate.calls) == held_at               # the kernel is still in B's chunk
                gate.allow(None)
            await long.aclose()
    steps = [c for c in gate.calls[held_at:] if c[0] != "prefill_chunk"]
    assert steps[0] in (("decode_batch", 2), ("verify_batch", 2)), steps
    assert res["c"] and res["d"]


async def _reuse_plans(events: list, n: int) -> None:
    """Until `n` prefills have been planned as extensions of their slot's live state."""
    with trio.fail_after(10):
        while sum(1 for e in events if e["event"] == "prefill_plan" and e["action"] == "reuse_live") < n:
            await trio.sleep(0.002)
