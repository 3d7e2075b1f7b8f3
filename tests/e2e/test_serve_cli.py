"""`cairn serve` as a process: config errors, readiness notification, systemd socket activation."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time



CAIRN = [sys.executable, "-m", "cairn.daemon.cli", "serve"]


def test_bad_setting_exits_2_naming_it(tiny_model_dir):
    r = subprocess.run(CAIRN + ["--model", str(tiny_model_dir), "--chunk", "0"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "'chunk'" in r.stderr and "--chunk" in r.stderr
    r = subprocess.run(CAIRN, capture_output=True, text=True, timeout=60, env={**os.environ, "CAIRN_MODEL": ""})
    assert r.returncode == 2 and "'model'" in r.stderr


def _get(path: str, url: str = "/health") -> bytes:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(f"GET {url} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def test_socket_activation_and_ready_notification(tiny_model_dir, tmp_path):
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
        assert b'"status":"ok"' in _get(str(sock))        # the connection starts the daemon
        assert n.recv(4096) == b"READY=1"
        assert not (tmp_path / "unused.sock").exists()     # the passed socket is used, none bound
        proc.terminate()
        assert proc.wait(timeout=10) == 0
        assert n.recv(4096) == b"STOPPING=1"
    finally:
        if proc.poll() is None:
            proc.kill()
        n.close()
