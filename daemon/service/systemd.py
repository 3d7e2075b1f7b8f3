"""systemd integration without libsystemd: sd_notify, the watchdog and socket activation.

Design notes:
- `notify` opens a fresh non-blocking datagram socket per call, so it never blocks the event loop
  (a full queue on systemd's side returns False instead of stalling) and holds no fd between calls.
  A leading `@` in $NOTIFY_SOCKET names an abstract socket (the `@` becomes a NUL byte).
- `watchdog_task` is a Trio task on purpose: if the event loop is stuck, the pings stop and systemd
  restarts us, which is what WatchdogSec= is for. A ping from a thread would hide the hang.
  The one exception is `pinging`, for the blocking model load before the event loop exists (minutes
  for a real model, with WatchdogSec=30): a thread pings until the load returns, and a load that never
  does is stopped by TimeoutStartSec=.
- `listen_fds` follows sd_listen_fds(3): fds start at 3, only for us if LISTEN_PID is our pid; the
  variables are always removed so children do not inherit them; missing or empty names read "unknown".
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import threading
import time

import trio

SD_LISTEN_FDS_START = 3
_LISTEN_VARS = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


def notify(*lines: str) -> bool:
    """Send `lines` (e.g. "READY=1", "STATUS=...") to $NOTIFY_SOCKET. False if unset or not delivered."""
    path = os.environ.get("NOTIFY_SOCKET", "")
    if not path or path[0] not in "/@" or len(path) < 2:
        return False
    address = "\0" + path[1:] if path[0] == "@" else path
    payload = "\n".join(lines).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK) as sock:
            return sock.sendto(payload, address) == len(payload)
    except OSError:  # no listener, queue full, permission: notifications are best-effort
        return False


def ready() -> bool:
    return notify("READY=1")


def status(text: str) -> bool:
    return notify("STATUS=" + text.replace("\n", " "))


def stopping() -> bool:
    return notify("STOPPING=1")


def watchdog_interval() -> float | None:
    """The watchdog timeout in seconds from WATCHDOG_USEC, or None when the watchdog is not ours."""
    pid = os.environ.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None
    try:
        usec = int(os.environ.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    return usec / 1_000_000 if usec > 0 else None


async def watchdog_task(interval: float | None, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Send WATCHDOG=1 now and then every `interval`/2 seconds, forever. `None` means no watchdog: return."""
    if interval is None:
        task_status.started()
        return
    notify("WATCHDOG=1")
    task_status.started()
    while True:
        await trio.sleep(interval / 2)
        notify("WATCHDOG=1")


@contextlib.contextmanager
def pinging(what: str, interval: float | None, *, status_every: float = 10.0):
    """Around a blocking step that runs before the event loop (loading the model): `STATUS=<what>`
    now, then from a thread WATCHDOG=1 every `interval`/2 (`interval` None: no watchdog) and
    `STATUS=<what>: N s so far` every `status_every` seconds, until the step ends."""
    status(what)
    stop = threading.Event()

    def run() -> None:
        start = last_status = time.monotonic()
        tick = min(interval / 2, status_every) if interval else status_every
        if interval:
            notify("WATCHDOG=1")
        while not stop.wait(tick):
            if interval:
                notify("WATCHDOG=1")
            now = time.monotonic()
            if now - last_status >= status_every:
                last_status = now
                status(f"{what}: {now - start:.0f} s so far")

    pinger = threading.Thread(target=run, name="cairn-load-watchdog", daemon=True)
    pinger.start()
    try:
        yield
    finally:
        stop.set()
        pinger.join()


def listen_fds() -> list[tuple[str, socket.socket]]:
    """Sockets passed by systemd (or systemd-socket-activate) as (FileDescriptorName, socket) pairs."""
    env = {name: os.environ.pop(name, None) for name in _LISTEN_VARS}
    if env["LISTEN_PID"] != str(os.getpid()):
        return []
    try:
        count = int(env["LISTEN_FDS"] or "0")
    except ValueError:
        return []
    given = (env["LISTEN_FDNAMES"] or "").split(":")
    names = [(given[i] if i < len(given) else "") or "unknown" for i in range(count)]
    result = []
    for i, name in enumerate(names):
        fd = SD_LISTEN_FDS_START + i
        fcntl.fcntl(fd, fcntl.F_SETFD, fcntl.fcntl(fd, fcntl.F_GETFD) | fcntl.FD_CLOEXEC)
        result.append((name, socket.socket(fileno=fd)))  # family and type are read from the fd
    return result
