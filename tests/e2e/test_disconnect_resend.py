"""A vanished client is cancelled, the engine acknowledges, and the slot is free again — with a real
`cairn serve` process (issue 40, found by the soak).

Three clients at once each stream a request, hang up mid-decode and send the same request again.
Before a488a68 a decode step withdrawn by the cancel (queued behind another request's prefill chunk)
left the request's cleanup waiting, shielded, for a step that never ran: the request stayed in
`decode`, its slot never freed, and SIGTERM no longer ended the daemon. Here every request ends
(done or cancelled), every slot is idle afterwards, and SIGTERM exits 0.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import numpy as np
import trio

from daemon_harness import open_request, request

CLIENTS, ROUNDS = 3, 6
HANG_GUARD_S = 120          # only against a hang: the run takes a few seconds


def test_three_clients_disconnect_mid_decode_and_resend_every_slot_ends_idle(tiny_model_dir, tmp_path):
    sock = tmp_path / "c.sock"
    # A small chunk makes each resent prompt's prefill many gate turns, so the other clients' decode
    # steps queue behind it when their clients hang up (the withdrawn-step path).
    proc = subprocess.Popen([sys.executable, "-m", "cairn.daemon.cli.main", "serve", "--model", str(tiny_model_dir),
                             "--socket", str(sock), "--slots", "4", "--chunk", "32", "--segment", "256",
                             "--speculate", "off", "--no-checkpoints"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "CAIRN_LOG_LEVEL": "info"})
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()

    def events(name: str) -> list[dict]:
        out = []
        for ln in list(lines):
            if ln.startswith("{") and f'"{name}"' in ln:
                e = json.loads(ln)
                if e.get("event") == name:
                    out.append(e)
        return out

    rng = np.random.default_rng(40)
    resent: list[dict] = []
    cut_after: list[int] = []

    async def client(k: int) -> None:
        for r in range(ROUNDS):
            prompt = [int(t) for t in rng.integers(20, 500, size=int(rng.integers(300, 700)))]
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 300, "ignore_eos": True, "temperature": 0}
            s = await open_request(sock, "POST", "/v1/completions", {**body, "stream": True})
            want = int(rng.integers(2, 12))                 # hang up after this many streamed tokens
            data, seen = b"", 0
            while seen < want:
                chunk = await s.receive_some(65536)
                assert chunk, f"client {k} round {r}: the stream ended before token {want}: {data[-500:]!r}"
                data += chunk
                seen = data.count(b'"text"')
            await s.aclose()                                # mid-decode: 300 tokens were asked for
            cut_after.append(seen)
            resp = await request(sock, "POST", "/v1/completions", body)
            assert resp.status == 200, resp.body[:500]
            resent.append(resp.json())

    async def run() -> dict:
        with trio.fail_after(HANG_GUARD_S):
            while not events("listening"):
                assert proc.poll() is None, "".join(lines)
                await trio.sleep(0.01)
            async with trio.open_nursery() as n:
                for k in range(CLIENTS):
                    n.start_soon(client, k)
            # the last cancels may still be acknowledged: wait until the engine holds no request
            while True:
                status = (await request(sock, "GET", "/v1/status")).json()
                if (all(s["phase"] == "idle" for s in status["slots"]) and not status["active"]
                        and status["queue"]["depth"] == 0):
                    return status
                await trio.sleep(0.05)

    try:
        try:
            status = trio.run(run)
        except trio.TooSlowError:
            stuck = (trio.run(request, sock, "GET", "/v1/status")).json()["slots"]
            raise AssertionError(f"requests never ended; slots: {stuck}") from None
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)                          # a wedged task would keep it alive
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(10)
    out = "".join(lines)
    assert rc == 0, out[-3000:]
    assert [s["phase"] for s in status["slots"]] == ["idle"] * 4
    assert len(resent) == len(cut_after) == CLIENTS * ROUNDS
    assert all(r["choices"][0]["finish_reason"] == "length" for r in resent)
    ended = events("request")
    outcomes = sorted(e["outcome"] for e in ended)
    # every request ended as itself: the resent ones done, the hung-up ones cancelled (or done, had
    # its last tokens gone out before the hang-up was seen)
    assert len(ended) == 2 * CLIENTS * ROUNDS, outcomes
    assert set(outcomes) <= {"done", "cancelled"}, outcomes
    assert outcomes.count("cancelled") >= CLIENTS * ROUNDS // 2, outcomes
    names = [e["event"] for e in (json.loads(ln) for ln in lines if ln.startswith("{"))]
    assert names.index("shutting_down") < names.index("stopped")
