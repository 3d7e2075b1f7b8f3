"""`cairn serve` as a process: config errors, readiness notification, systemd socket activation."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from daemon_harness import unix_get
from skip_policy import host_cannot, systemd_tools_missing

# one slot: the default (from the machine's memory) would vary by host
CAIRN = [sys.executable, "-m", "cairn.daemon.cli.main", "serve", "--slots", "1"]


def test_bad_setting_exits_2_naming_it(tiny_model_dir):
    r = subprocess.run(CAIRN + ["--model", str(tiny_model_dir), "--chunk", "0"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "'chunk'" in r.stderr and "--chunk" in r.stderr
    r = subprocess.run(CAIRN, capture_output=True, text=True, timeout=60, env={**os.environ, "CAIRN_MODEL": ""})
    assert r.returncode == 2 and "'model'" in r.stderr


def _next_not_status(n: socket.socket) -> bytes:
    """The next notification that is not a STATUS= line (those come and go with the work)."""
    while (msg := n.recv(4096)).startswith(b"STATUS="):
        pass
    return msg


def test_socket_activation_and_ready_notification(tiny_model_dir, tmp_path):
    if (missing := systemd_tools_missing()) is not None:
        host_cannot(missing)
    sock, notify = tmp_path / "api.sock", tmp_path / "notify.sock"
    n = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    n.bind(str(notify))
    n.settimeout(30)
    env = {**os.environ, "NOTIFY_SOCKET": str(notify)}
    proc = subprocess.Popen(["systemd-socket-activate", "-l", str(sock), "--fdname=api", "-E", "NOTIFY_SOCKET",
                             *CAIRN, "--model", str(tiny_model_dir), "--socket", str(tmp_path / "unused.sock")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert b'"status":"ok"' in unix_get(str(sock))        # the connection starts the daemon
        assert _next_not_status(n) == b"READY=1"
        assert not (tmp_path / "unused.sock").exists()     # the passed socket is used, none bound
        proc.terminate()
        assert proc.wait(timeout=10) == 0
        assert _next_not_status(n) == b"STOPPING=1"
    finally:
        if proc.poll() is None:
            proc.kill()
        n.close()


def _post(path: str, url: str, body: dict) -> bytes:
    import json

    raw = json.dumps(body).encode()
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(60)
        s.connect(path)
        s.sendall(f"POST {url} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(raw)}\r\nConnection: close\r\n\r\n".encode() + raw)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def test_notify_protocol_ready_status_watchdog_stopping(tiny_model_dir, tmp_path):
    """Against a fake NOTIFY_SOCKET: STATUS while loading, READY=1 only once the socket accepts, STATUS
    lines with prefill progress, WATCHDOG=1 at half the interval, STOPPING=1 on SIGTERM, exit 0."""
    sock, notify = tmp_path / "api.sock", tmp_path / "notify.sock"
    n = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    n.bind(str(notify))
    n.settimeout(30)
    env = {**os.environ, "NOTIFY_SOCKET": str(notify), "WATCHDOG_USEC": "400000"}
    env.pop("WATCHDOG_PID", None)
    proc = subprocess.Popen([*CAIRN, "--model", str(tiny_model_dir), "--socket", str(sock), "--segment", "64",
                             "--chunk", "16", "--progress-interval-ms", "0"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    got: list[tuple[float, str]] = []

    def until(pred) -> str:
        while True:
            msg = n.recv(4096).decode()
            got.append((time.monotonic(), msg))
            if pred(msg):
                return msg

    try:
        assert until(lambda m: m.startswith("STATUS=")).startswith("STATUS=loading model")
        until(lambda m: m == "READY=1")
        assert b'"status":"ok"' in unix_get(str(sock))             # READY=1 means the socket accepts now
        assert not any(m == "READY=1" for _, m in got[:-1])
        reply = _post(str(sock), "/v1/completions", {"model": tiny_model_dir.name, "prompt": list(range(5, 305)),
                                                     "max_tokens": 1})
        assert b" 200 " in reply.split(b"\r\n", 1)[0]
        t0 = time.monotonic()
        until(lambda m: time.monotonic() - t0 > 2.0)
        proc.terminate()
        until(lambda m: m == "STOPPING=1")
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        n.close()
    statuses = [m for _, m in got if m.startswith("STATUS=")]
    assert any(m.startswith("STATUS=serving") for m in statuses)
    progress = [m for m in statuses if "prefill" in m]
    assert len(progress) >= 4 and progress[-1].endswith("300/300 tokens"), progress
    pings = [t for t, m in got if m == "WATCHDOG=1" and t >= t0]
    gaps = [b - a for a, b in zip(pings, pings[1:])]
    assert len(pings) >= 6 and all(0.1 < g < 0.4 for g in gaps), gaps   # every 0.2 s (half of 0.4 s)
