"""`GET /v1/status` polled without pause while four slots prefill and decode on the real kernel (tiny
model): the daemon never reads a state a kernel call holds (issue 40 §1; actors/engine/sequence.py), so every
poll answers, every request gets exactly its greedy answer, and the daemon stays up. The kernel refuses
a busy state's getters, so a status, memory-guard or slot reader that touched a live state would fail
here (a 500 or a crash) instead of racing the call's writes."""

from __future__ import annotations

import numpy as np
import pytest
import trio
from structlog.testing import capture_logs

from daemon_harness import daemon, real_loaded, reference_greedy, request, token_strings

RNG = np.random.default_rng(40)
MIN_POLLS = 2000
POLLERS = 4          # concurrent pollers, as several operators' `cairn status` and a dashboard
N_OUT = 32


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return real_loaded(tiny_model_dir, threads=1)   # a core left for the event loop and its polls


async def test_status_polled_thousands_of_times_while_four_slots_prefill_and_decode(loaded, tmp_path):
    sock = tmp_path / "s.sock"
    # eight conversations over four slots, so slots keep switching (prefills of many chunks and page
    # groups: the tiny model's groups are 256 tokens) while others decode
    prompts = [[int(t) for t in RNG.integers(20, 500, size=n)] for n in (1400, 333, 1800, 900, 700, 1100, 520, 1500)]
    answers: list[tuple[int, int, list]] = []          # (prompt index, status, tokens)
    polls = {"n": 0, "bad": [], "tokens_seen": 0}
    with trio.fail_after(300), capture_logs() as events:
        async with daemon(loaded, sock, slots=4, chunk=32):
            async def poll() -> None:
                while polls["n"] < MIN_POLLS:
                    r = await request(sock, "GET", "/v1/status")
                    polls["n"] += 1
                    if r.status != 200:
                        polls["bad"].append((r.status, r.body[:200]))
                        continue
                    polls["tokens_seen"] = max(polls["tokens_seen"],
                                               sum(s["state_tokens"] for s in r.json()["slots"]))

            async def client(i: int) -> None:
                k, mine = i, 0
                # requests run for as long as the polls do, and at least twice each (a slow build: ASan)
                while polls["n"] < MIN_POLLS or mine < 2:
                    mine += 1
                    body = {"model": "tiny", "prompt": prompts[k], "temperature": 0, "max_tokens": N_OUT,
                            "logprobs": 1, "ignore_eos": True}
                    r = await request(sock, "POST", "/v1/completions", body)
                    answers.append((k, r.status, r.json()["choices"][0]["logprobs"]["tokens"]
                                    if r.status == 200 else r.body[:300]))
                    k = (k + 4) % len(prompts)

            async with trio.open_nursery() as nursery:
                for _ in range(POLLERS):
                    nursery.start_soon(poll)
                for i in range(4):
                    nursery.start_soon(client, i)
            health = await request(sock, "GET", "/health")
    assert not polls["bad"], polls["bad"][:3]
    print(f"status polls: {polls['n']}, requests: {len(answers)}")
    assert polls["n"] >= MIN_POLLS and polls["tokens_seen"] > 0     # the polls saw the states grow
    assert health.status == 200
    assert len(answers) >= 8
    want = {k: token_strings(loaded, reference_greedy(loaded, prompts[k], N_OUT)) for k, _, _ in answers}
    for k, status, got in answers:
        assert status == 200 and got == want[k], (k, status)
    assert sorted({e["slot"] for e in events if e["event"] == "request"}) == [0, 1, 2, 3]
