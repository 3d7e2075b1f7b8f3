"""Slot mode on the real kernel (tiny model): concurrent streams, batched decode steps, and each
answer exactly the kernel's own greedy continuation of that prompt alone."""

from __future__ import annotations

import numpy as np
import pytest
import trio
from structlog.testing import capture_logs

from daemon_harness import daemon, real_loaded, reference_greedy, request, token_strings

RNG = np.random.default_rng(14)


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return real_loaded(tiny_model_dir)


async def test_three_concurrent_streams_each_equal_greedy_alone(loaded, tmp_path):
    sock = tmp_path / "c.sock"
    prompts = [[int(t) for t in RNG.integers(20, 500, size=n)] for n in (90, 17, 300)]
    n_out = 12
    res: dict = {}
    with trio.fail_after(120), capture_logs() as events:
        async with daemon(loaded, sock, slots=3, chunk=32):
            async with trio.open_nursery() as nursery:
                async def go(i):
                    body = {"model": "tiny", "prompt": prompts[i], "temperature": 0, "max_tokens": n_out,
                            "logprobs": 1, "ignore_eos": True}
                    res[i] = (await request(sock, "POST", "/v1/completions", body)).json()
                for i in range(3):
                    nursery.start_soon(go, i)
            status = (await request(sock, "GET", "/v1/status")).json()
            metrics = (await request(sock, "GET", "/metrics")).body.decode()
    for i, p in enumerate(prompts):
        assert res[i]["choices"][0]["logprobs"]["tokens"] == token_strings(loaded, reference_greedy(loaded, p, n_out))
    values = {ln.split()[0]: float(ln.split()[1]) for ln in metrics.splitlines() if ln and not ln.startswith("#")}
    steps, rows = values["cairn_decode_steps_total"], values["cairn_decode_step_rows_total"]
    assert rows == 3 * (n_out - 1) and steps < rows          # sequences shared decode steps
    served = sorted(e["slot"] for e in events if e["event"] == "request")
    assert served == [0, 1, 2]
    assert [s["phase"] for s in status["slots"]] == ["idle"] * 3
    # the live states stay: each holds its prompt plus every answer token but the last
    assert sorted(s["state_tokens"] for s in status["slots"]) == sorted(len(p) + n_out - 1 for p in prompts)


async def test_slots_default_from_memory_budget_is_logged_and_shown_in_status(loaded, tmp_path):
    """No slots setting: the daemon picks the number from the memory plan (1..4), logs it with the
    reason, and /v1/status shows the same number and reason."""
    sock = tmp_path / "c.sock"
    with trio.fail_after(60), capture_logs() as events:
        async with daemon(loaded, sock, slots=None):
            status = (await request(sock, "GET", "/v1/status")).json()
    chosen = [e for e in events if e["event"] == "slots"]
    assert len(chosen) == 1 and 1 <= chosen[0]["slots"] <= 4
    assert "share(s) of" in chosen[0]["reason"] and "32768 tokens" in chosen[0]["reason"]
    assert status["engine"]["slots"] == chosen[0]["slots"]
    assert status["engine"]["slots_reason"] == chosen[0]["reason"]
