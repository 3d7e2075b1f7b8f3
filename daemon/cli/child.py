"""A daemon started as a child process (`cairn serve` from a script, a benchmark or a test): wait
until it serves. The socket file alone is not enough (it exists a moment before the server accepts),
so this waits for `GET /health` to answer 200."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path


def _healthy(path: str) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(path)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: cairn\r\nConnection: close\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def wait_until_serving(path: str | Path, proc: subprocess.Popen, timeout: float = 120.0,
                       log: str | Path | None = None) -> None:
    """Returns once the daemon `proc` answers on the Unix socket `path`. RuntimeError when it exits
    first or `timeout` seconds pass, with its exit status and the end of its `log` file."""
    deadline = time.monotonic() + timeout
    while not _healthy(str(path)):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = Path(log).read_text(errors="replace")[-3000:] if log and Path(log).exists() else ""
            what = f"exited with {proc.returncode}" if proc.poll() is not None else f"not serving after {timeout:g} s"
            raise RuntimeError(f"daemon {what} (socket {path}): {tail}")
        time.sleep(0.05)
