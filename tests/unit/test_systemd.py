"""cairn.daemon.systemd against fakes: a datagram socket as $NOTIFY_SOCKET, fds passed to a child
process as systemd would, and (when installed) the real systemd-socket-activate and systemd-analyze.

Rules: no sleeps for timing (the watchdog runs on trio's autojump clock); every wait on a child or a
socket has a timeout; sockets live in short temporary directories (AF_UNIX paths are limited to 108
bytes).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import trio

from cairn.daemon import systemd

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "systemd"
TIMEOUT = 20


@pytest.fixture
def sockdir():
    with tempfile.TemporaryDirectory(prefix="cairn-sd-", dir="/tmp") as d:
        yield Path(d)


@pytest.fixture
def notify_socket(sockdir, monkeypatch):
    """A bound datagram socket standing in for systemd; $NOTIFY_SOCKET points at it."""
    path = sockdir / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(TIMEOUT)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        yield sock


def drain(sock: socket.socket) -> list[bytes]:
    out = []
    sock.setblocking(False)
    try:
        while True:
            out.append(sock.recv(4096))
    except BlockingIOError:
        return out
    finally:
        sock.settimeout(TIMEOUT)


# --- notify -------------------------------------------------------------------------------------

def test_notify_lines_arrive_as_one_datagram(notify_socket):
    assert systemd.notify("READY=1", "STATUS=loading model")
    assert notify_socket.recv(4096) == b"READY=1\nSTATUS=loading model"


def test_ready_status_stopping(notify_socket):
    assert systemd.ready() and systemd.status("serving\non two lines") and systemd.stopping()
    assert [notify_socket.recv(4096) for _ in range(3)] == [b"READY=1", b"STATUS=serving on two lines",
                                                            b"STOPPING=1"]


def test_notify_abstract_namespace(monkeypatch):
    name = f"cairn-test-{os.getpid()}-{id(monkeypatch)}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(TIMEOUT)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert systemd.notify("READY=1")
        assert sock.recv(4096) == b"READY=1"


@pytest.mark.parametrize("value", [None, "", "relative/path", "@"])
def test_notify_without_usable_socket_is_a_noop(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    else:
        monkeypatch.setenv("NOTIFY_SOCKET", value)
    assert systemd.notify("READY=1") is False


def test_notify_to_missing_listener_returns_false(sockdir, monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", str(sockdir / "nobody-here"))
    assert systemd.notify("READY=1") is False


# --- watchdog -----------------------------------------------------------------------------------

@pytest.mark.parametrize("env, expected", [
    ({"WATCHDOG_USEC": "30000000"}, 30.0),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "<self>"}, 30.0),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),   # meant for another process
    ({"WATCHDOG_USEC": "0"}, None),
    ({"WATCHDOG_USEC": "soon"}, None),
    ({}, None),
])
def test_watchdog_interval(monkeypatch, env, expected):
    for name in ("WATCHDOG_USEC", "WATCHDOG_PID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, str(os.getpid()) if value == "<self>" else value)
    assert systemd.watchdog_interval() == expected


async def test_watchdog_pings_every_half_interval(autojump_clock, monkeypatch):
    sent: list[tuple[float, tuple[str, ...]]] = []
    monkeypatch.setattr(systemd, "notify", lambda *lines: sent.append((trio.current_time(), lines)) or True)
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        await nursery.start(systemd.watchdog_task, 30.0)
        assert len(sent) == 1, "the first ping goes out before started()"
        await trio.sleep(61)
        nursery.cancel_scope.cancel()
    assert [(round(t - start, 6), lines) for t, lines in sent] == [(t, ("WATCHDOG=1",)) for t in (0, 15, 30, 45, 60)]


async def test_watchdog_task_reaches_the_socket(autojump_clock, notify_socket):
    with trio.move_on_after(31):
        await systemd.watchdog_task(20.0)
    assert drain(notify_socket) == [b"WATCHDOG=1"] * 4  # t = 0, 10, 20, 30


async def test_watchdog_task_without_interval_returns(notify_socket):
    async with trio.open_nursery() as nursery:
        await nursery.start(systemd.watchdog_task, None)
    assert drain(notify_socket) == []


# --- socket activation: listen_fds --------------------------------------------------------------

# Prints what listen_fds() returned, then serves one connection on the socket named "api".
CHILD = textwrap.dedent("""
    import fcntl, json, os, socket, sys
    from cairn.daemon import systemd
    got = systemd.listen_fds()
    report = {
        "names": [name for name, _ in got],
        "fds": [s.fileno() for _, s in got],
        "families": [s.family.name for _, s in got],
        "types": [s.type.name for _, s in got],
        "cloexec": [bool(fcntl.fcntl(s.fileno(), fcntl.F_GETFD) & fcntl.FD_CLOEXEC) for _, s in got],
        "env_left": sorted(k for k in os.environ if k.startswith("LISTEN_")),
        "notified": systemd.ready(),
    }
    print(json.dumps(report), flush=True)
    api = dict(got)["api"]
    api.settimeout(20)
    conn, _ = api.accept()
    with conn:
        conn.sendall(b"hello from fd %d" % api.fileno())
""")

# Puts the given fds at 3, 4, ... and sets LISTEN_* for its own pid, then execs CHILD (same pid):
# what systemd does between fork() and exec().
BOOT = textwrap.dedent("""
    import os, sys
    names, fds = sys.argv[1], [int(x) for x in sys.argv[2:]]
    for i, fd in enumerate(fds):
        os.dup2(fd, 3 + i)  # dup2 clears FD_CLOEXEC, like systemd's fd passing
    for fd in fds:
        if fd >= 3 + len(fds):
            os.close(fd)
    os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS=str(len(fds)), LISTEN_FDNAMES=names)
    os.execv(sys.executable, [sys.executable, "-c", os.environ.pop("CAIRN_TEST_CHILD")])
""")


def _listener(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.listen(4)
    return s


def _read_reply(path: Path) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
        c.settimeout(TIMEOUT)
        c.connect(str(path))
        return c.recv(4096)


def test_listen_fds_in_a_child_with_fds_from_3(sockdir):
    api, metrics = _listener(sockdir / "api.sock"), _listener(sockdir / "metrics.sock")
    with api, metrics:
        env = dict(os.environ, CAIRN_TEST_CHILD=CHILD)
        child = subprocess.Popen([sys.executable, "-c", BOOT, "api:metrics", str(api.fileno()), str(metrics.fileno())],
                                 pass_fds=[api.fileno(), metrics.fileno()], env=env, stdout=subprocess.PIPE, text=True)
    try:
        report = json.loads(child.stdout.readline())
        assert report == {"names": ["api", "metrics"], "fds": [3, 4], "families": ["AF_UNIX", "AF_UNIX"],
                          "types": ["SOCK_STREAM", "SOCK_STREAM"], "cloexec": [True, True], "env_left": [],
                          "notified": False}
        assert _read_reply(sockdir / "api.sock") == b"hello from fd 3"
        assert child.wait(TIMEOUT) == 0
    finally:
        child.kill()
        child.wait()


def test_listen_fds_for_another_pid_is_ignored_and_unset(monkeypatch):
    monkeypatch.setenv("LISTEN_PID", "1")
    monkeypatch.setenv("LISTEN_FDS", "1")
    monkeypatch.setenv("LISTEN_FDNAMES", "api")
    assert systemd.listen_fds() == []
    assert not {"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} & set(os.environ)


def test_listen_fds_without_variables():
    assert "LISTEN_PID" not in os.environ
    assert systemd.listen_fds() == []


def test_listen_fds_names_default_to_unknown(sockdir):
    api = _listener(sockdir / "api.sock")
    with api:
        env = dict(os.environ, CAIRN_TEST_CHILD=CHILD.replace('dict(got)["api"]', "got[0][1]"))
        child = subprocess.Popen([sys.executable, "-c", BOOT, "", str(api.fileno())], pass_fds=[api.fileno()],
                                 env=env, stdout=subprocess.PIPE, text=True)
    try:
        # LISTEN_FDNAMES="" for one fd: the count does not match, so the name is "unknown" (sd_listen_fds)
        assert json.loads(child.stdout.readline())["names"] == ["unknown"]
        assert _read_reply(sockdir / "api.sock") == b"hello from fd 3"
    finally:
        child.kill()
        child.wait()


ACTIVATE = shutil.which("systemd-socket-activate")


@pytest.mark.skipif(ACTIVATE is None, reason="systemd-socket-activate missing: run scripts/ensure-systemd-tools.sh")
def test_under_systemd_socket_activate(sockdir, notify_socket):
    """The real tool listens, starts the child on the first connection and passes fd 3 named "api"."""
    path = sockdir / "cairn.sock"
    env = dict(os.environ, CAIRN_TEST_CHILD=CHILD)
    activator = subprocess.Popen([ACTIVATE, "-l", str(path), "--fdname=api", "-E", "NOTIFY_SOCKET", "-E",
                                  "PYTHONPATH", sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    try:
        for line in activator.stderr:  # "Listening on /…/cairn.sock as 3." once the socket is bound
            if line.startswith("Listening on"):
                break
        else:
            pytest.fail(f"systemd-socket-activate exited with {activator.wait(TIMEOUT)} before listening")
        assert _read_reply(path) == b"hello from fd 3"
        report = json.loads(activator.stdout.readline())
        assert report["names"] == ["api"] and report["fds"] == [3] and report["cloexec"] == [True]
        assert report["env_left"] == [] and report["notified"] is True
        assert notify_socket.recv(4096) == b"READY=1"
        assert activator.wait(TIMEOUT) == 0
    finally:
        activator.kill()
        activator.wait()
