"""A daemon with no memory flags inside a memory cgroup (issue 20): the memory plan reads the cgroup's
limit, four conversations grow toward it, the one that cannot fit ends with HTTP 507 naming memory after
the checkpoints were evicted for it, the others finish with the model's own tokens, and the OOM killer
never fires.

A second daemon on the same checkpoint directory (issue 40 §5) brings the three conversations back from
disk, each extended by a turn, beside the big one again: every disk restore asks the memory guard for
room first (twice the checkpoint while it is read and rebuilt), speculation is on (prompts of a small
alphabet, so prompt-lookup drafts are sent and verified), and again only the big one gets the error and
the group never sees an OOM kill.

The model is the `tiny-wide-state` preset (~3.3 KiB of state a token), so a few thousand tokens fill
what a 160 MiB limit leaves after the daemon itself (~45 MiB charged at start), the margin and the
checkpoint budget. The cgroup comes from tests/memory_cap.py; a host without one names this test in the
run's summary (a failure under CI: tests/skip_policy.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import trio

from cairn.daemon.cli.child import wait_until_serving
from daemon_harness import real_loaded, reference_greedy, request, token_strings
from memory_cap import memory_cap, memory_cap_unavailable_reason
from skip_policy import host_cannot

LIMIT = 160 << 20
SMALL_TOKENS = 700          # >= checkpoint_min_tokens: each leaves a prompt-end checkpoint
BIG_TOKENS = 40_000         # ~130 MB of state: with the daemon itself over the limit, were it not refused
DECODE = 12


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory) -> Path:
    from cairn.daemon.modelgen.make_model import make_model

    return make_model("tiny-wide-state", 0, tmp_path_factory.mktemp("wide") / "wide")


def _body(prompt: list[int]) -> dict:
    return {"model": "wide", "prompt": prompt, "temperature": 0, "max_tokens": DECODE, "ignore_eos": True,
            "logprobs": 1}


async def _wait_for_socket(sock: Path, proc: subprocess.Popen, log: Path) -> None:
    await trio.to_thread.run_sync(partial(wait_until_serving, sock, proc, timeout=60, log=log))


async def _serve(cap, argv: list[str], sock: Path, log: Path):
    with open(log, "w") as out:
        proc = cap.popen(argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "CAIRN_LOG_LEVEL": "info"})
    await _wait_for_socket(sock, proc, log)
    return proc


def _stop(proc) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        proc.wait(timeout=30)


async def _four(sock: Path, prompts: dict[str, list[int]]) -> dict:
    """Send the four conversations, a, then the big one, then b and c behind it (admission is first
    come, first served); their responses."""
    results: dict = {}

    async def send(name: str, prompt: list[int]) -> None:
        results[name] = await request(sock, "POST", "/v1/completions", _body(prompt))

    with trio.fail_after(240):
        async with trio.open_nursery() as n:
            for name in ("a", "big", "b", "c"):
                n.start_soon(send, name, prompts[name])
                await trio.sleep(0.3)
    return results


async def _wait_written(sock: Path, n: int) -> None:
    """Until n checkpoints have a file (the writer runs off the request path)."""
    with trio.fail_after(60):
        while True:
            rows = (await request(sock, "GET", "/v1/checkpoints")).json()["data"]
            if sum("disk" in r["tier"] for r in rows) >= n:
                return
            await trio.sleep(0.1)


def _events(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def _counter(metrics: str, name: str) -> float:
    return sum(float(ln.split()[-1]) for ln in metrics.splitlines() if ln.startswith(name))


async def test_four_conversations_under_a_cgroup_limit_one_gets_507_the_others_finish(wide_model, tmp_path):
    rng = np.random.default_rng(20)
    small = [[int(t) for t in rng.integers(2, 500, size=SMALL_TOKENS)] for _ in range(3)]
    # the second turn holds the pair (its last token, v) for every token v: whatever the model picks
    # first, the two-token suffix has occurred before, so a draft is sent and verified
    vocab = int(json.loads((wide_model / "config.json").read_text())["vocab_size"])
    turn2 = [[t for v in range(2, vocab) for t in (last, v)] + [last] for last in (3, 4, 5)]
    big = [int(t) for t in rng.integers(2, 500, size=BIG_TOKENS)]
    sock, logs = tmp_path / "d.sock", [tmp_path / "daemon1.log", tmp_path / "daemon2.log"]
    argv = [sys.executable, "-m", "cairn.daemon.cli.main", "serve", "--model", str(wide_model), "--socket", str(sock),
            "--checkpoint-dir", str(tmp_path / "state"), "--packed-cache-dir", str(tmp_path / "packed"),
            "--threads", "2", "--speculate", "on", "--disk-checkpoints"]
    if (reason := memory_cap_unavailable_reason()) is not None:
        host_cannot(reason)
    cap_cm = memory_cap(LIMIT, "memory-limit")
    cap = cap_cm.__enter__()
    proc = None
    try:
        proc = await _serve(cap, argv, sock, logs[0])
        status = (await request(sock, "GET", "/v1/status")).json()
        plan = status["memory"]["plan"]
        assert plan["limit_source"].startswith("cgroup v"), plan        # the cgroup binds, not MemAvailable
        assert plan["limit_bytes"] == LIMIT and plan["room_bytes"] < LIMIT
        assert plan["parts"]["checkpoints"] < 2048 << 20                   # cut to fit the limit
        assert plan["journal_bytes"] > 0 and plan["parts"]["bodies"] > 0  # speculation's journal, bodies: counted
        pool = plan["parts"]["states"] + plan["parts"]["checkpoints"]
        assert pool > SMALL_TOKENS * plan["per_token_bytes"] * 2
        # unguarded, the big conversation's state would take the daemon past the limit: the OOM killer
        assert BIG_TOKENS * plan["per_token_bytes"] > LIMIT - plan["room_bytes"] + LIMIT // 2

        t0 = time.monotonic()
        first = await _four(sock, {"a": small[0], "big": big, "b": small[1], "c": small[2]})
        elapsed = time.monotonic() - t0
        after = (await request(sock, "GET", "/v1/status")).json()
        await _wait_written(sock, 3)                   # the three prompt-end checkpoints, on disk
        assert proc.poll() is None, "the daemon died"
        _stop(proc)

        # a second daemon on the same directory: the conversations come back from disk, extended a turn
        proc = await _serve(cap, argv, sock, logs[1])
        second = await _four(sock, {"a": small[0] + turn2[0], "big": big, "b": small[1] + turn2[1],
                                    "c": small[2] + turn2[2]})
        after2 = (await request(sock, "GET", "/v1/status")).json()
        metrics = (await request(sock, "GET", "/metrics")).body.decode()
        assert proc.poll() is None, "the daemon died"
    finally:
        _stop(proc)
        oom_kills, peak = cap.oom_kills(), cap.peak_bytes()
        cap_cm.__exit__(None, None, None)

    assert oom_kills == 0 and peak <= LIMIT, (oom_kills, peak)
    for results, status_after, log in ((first, after, logs[0]), (second, after2, logs[1])):
        err = results["big"]
        assert err.status == 507, err.body[:500]
        assert err.json()["error"]["code"] == "insufficient_memory"
        assert err.json()["error"]["message"].startswith("memory:")
        assert status_after["memory"]["in_use"]["refused"] == 1
    names = [e.get("event") for e in _events(logs[0])]
    assert "checkpoint_evict_for_state" in names and "memory_exceeded" in names   # checkpoints went first
    assert names.index("checkpoint_evict_for_state") < names.index("memory_exceeded")
    hits = [e for e in _events(logs[1]) if e.get("event") == "checkpoint_hit"]
    assert sorted(e["tokens"] for e in hits if e["tier"] == "disk") == [SMALL_TOKENS] * 3, hits
    assert _counter(metrics, "cairn_spec_drafts_total") > 0                     # drafts were verified
    # the others: the model's own greedy tokens, as from a fresh state with no daemon involved
    loaded = real_loaded(wide_model)
    for results, prompts in ((first, small), (second, [p + t for p, t in zip(small, turn2)])):
        for name, prompt in zip("abc", prompts):
            r = results[name]
            assert r.status == 200, (name, r.body[:300])
            assert r.json()["choices"][0]["logprobs"]["tokens"] == token_strings(loaded, reference_greedy(
                loaded, prompt, DECODE)), name
    print(f"memory-limit e2e: limit {LIMIT >> 20} MiB, peak {peak / (1 << 20):.1f} MiB, pool {pool / (1 << 20):.1f} "
          f"MiB, first run's requests {elapsed:.1f} s; plan: {plan['reason']}")
