"""cairn.daemon.service.systemd against fakes: a datagram socket as $NOTIFY_SOCKET, fds passed to a child
process as systemd would, and (when installed) the real systemd-socket-activate and systemd-analyze.

Rules: no sleeps for timing (the watchdog runs on trio's autojump clock); every wait on a child or a
socket has a timeout; sockets live in short temporary directories (AF_UNIX paths are limited to 108
bytes).
"""

from __future__ import annotations
import functools

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

from cairn.daemon.service import systemd
from skip_policy import host_cannot, systemd_tools_missing

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


def test_watchdog_pings_while_a_slow_model_load_runs_before_ready(notify_socket, monkeypatch, tiny_model_dir,
                                                                sockdir):
    """A real model loads for minutes and WatchdogSec=30: `cairn serve` must feed the watchdog during
    the load, not only once serving. The load here blocks until three pings have arrived; then the
    daemon serves, says READY=1, and stops on SIGTERM."""
    import signal
    import threading

    from daemon_harness import fake_loaded

    from cairn.daemon.service.config import load_settings
    from cairn.daemon.service.main import serve

    monkeypatch.setenv("WATCHDOG_USEC", "20000")             # a ping every 10 ms
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    monkeypatch.delenv("LISTEN_PID", raising=False)
    settings = load_settings({"model": str(tiny_model_dir), "socket": str(sockdir / "c.sock")}, {})
    received: list[bytes] = []
    pinged = threading.Event()
    loads: list[str] = []

    def slow_load(s):
        loads.append("started")
        if pinged.wait(TIMEOUT):
            loads.append("pinged")
        return fake_loaded(tiny_model_dir)

    def read_until_stopping():
        try:
            while not received or received[-1] != b"STOPPING=1":
                received.append(notify_socket.recv(4096))
                if received.count(b"WATCHDOG=1") >= 3:
                    pinged.set()
                if received[-1] == b"READY=1":
                    os.kill(os.getpid(), signal.SIGTERM)     # the daemon's own handler stops it
        finally:
            pinged.set()

    def too_early(signum, frame):
        raise RuntimeError("SIGTERM arrived before the daemon listened for it")

    reader = threading.Thread(target=read_until_stopping, daemon=True)
    previous = signal.signal(signal.SIGTERM, too_early)
    try:
        reader.start()
        assert serve(settings, slow_load) == 0
    finally:
        signal.signal(signal.SIGTERM, previous)
    reader.join(TIMEOUT)
    assert loads == ["started", "pinged"], received
    ready = received.index(b"READY=1")
    assert received[0] == f"STATUS=loading model {tiny_model_dir}".encode()
    assert received[1:4] == [b"WATCHDOG=1"] * 3                 # during the load, before READY=1
    assert received[ready + 1].startswith(b"STATUS=serving tiny on ") and received[-1] == b"STOPPING=1"


def test_pinging_reports_load_time_in_status(notify_socket):
    with systemd.pinging("loading model m", None, status_every=0.01):
        first = notify_socket.recv(4096)
        second = notify_socket.recv(4096)
    assert first == b"STATUS=loading model m"
    assert re.fullmatch(rb"STATUS=loading model m: \d+ s so far", second), second
    drain(notify_socket)


async def test_watchdog_task_without_interval_returns(notify_socket):
    async with trio.open_nursery() as nursery:
        await nursery.start(systemd.watchdog_task, None)
    assert drain(notify_socket) == []


# --- socket activation: listen_fds --------------------------------------------------------------

# Prints what listen_fds() returned, then serves one connection on the socket named "api".
CHILD = textwrap.dedent("""
    import fcntl, json, os, socket, sys
    from cairn.daemon.service import systemd
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
ANALYZE = shutil.which("systemd-analyze")
SANDBOX = REPO / "scripts" / "sandbox-exec.py"


def needs_systemd_tools(fn):
    """As root, `make test` installs these (scripts/ensure-systemd-tools.sh); without them the test is
    one the host cannot run (named in the summary; a failure under CI: tests/skip_policy.py)."""
    def check(*args, **kwargs):
        if (missing := systemd_tools_missing()) is not None:
            host_cannot(missing)
        return fn(*args, **kwargs)
    return functools.wraps(fn)(check)


@needs_systemd_tools
@pytest.mark.parametrize("sandboxed", [False, True], ids=["plain", "unit-seccomp"])
def test_under_systemd_socket_activate(sockdir, notify_socket, sandboxed):
    """The real tool listens and passes fd 3 named "api"; also under the unit's seccomp filters."""
    path = sockdir / "cairn.sock"
    child = [sys.executable, "-c", CHILD]
    if sandboxed:
        child = [sys.executable, str(SANDBOX), "--strict", "--"] + child
    activator = subprocess.Popen([ACTIVATE, "-l", str(path), "--fdname=api", "-E", "NOTIFY_SOCKET", *child],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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


# --- the unit files ---------------------------------------------------------------------------------

@pytest.fixture
def installable_units(tmp_path):
    """The units with ExecStart pointed at this venv's `cairn`: verify checks that the binary exists."""
    cairn = Path(sys.executable).with_name("cairn")
    assert cairn.exists(), "the editable install provides the cairn entry point"
    service = (UNITS / "cairn.service").read_text()
    assert "\nExecStart=/usr/local/bin/cairn serve --config /etc/cairn/cairn.toml\n" in service
    (tmp_path / "cairn.service").write_text(service.replace("ExecStart=/usr/local/bin/cairn", f"ExecStart={cairn}"))
    shutil.copy(UNITS / "cairn.socket", tmp_path / "cairn.socket")
    return tmp_path


@needs_systemd_tools
def test_units_verify(installable_units):
    r = subprocess.run([ANALYZE, "verify", str(installable_units / "cairn.service"),
                        str(installable_units / "cairn.socket")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr


@needs_systemd_tools
def test_security_exposure_stays_low(installable_units):
    """docs/operations.md lists what remains exposed and why; a new exposure fails here first."""
    r = subprocess.run([ANALYZE, "security", "--offline=yes", "--no-pager", str(installable_units / "cairn.service")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    score = float(re.search(r"Overall exposure level for cairn.service: ([0-9.]+)", r.stdout).group(1))
    remaining = sorted(line.split()[1] for line in r.stdout.splitlines() if line.startswith("✗"))
    assert remaining == sorted(["SystemCallFilter=~@resources", "RootDirectory=/RootImage=", "RestrictAddressFamilies=~AF_UNIX", "ProcSubset=",
                                "PrivateUsers=", "DeviceAllow=", "UMask="]), r.stdout
    assert score <= 0.5, r.stdout


def test_unit_settings_the_daemon_relies_on():
    service = (UNITS / "cairn.service").read_text().splitlines()
    for line in ["Type=notify", "NotifyAccess=main", "WatchdogSec=30", "Restart=on-failure", "DynamicUser=yes",
                 "StateDirectory=cairn", "RuntimeDirectory=cairn", "RuntimeDirectoryPreserve=yes",
                 "ConfigurationDirectory=cairn", "MemoryDenyWriteExecute=yes", "RestrictAddressFamilies=AF_UNIX",
                 "UMask=0007", "CapabilityBoundingSet="]:
        assert line in service
    socket_unit = (UNITS / "cairn.socket").read_text().splitlines()
    for line in ["ListenStream=/run/cairn/cairn.sock", "SocketMode=0660", "FileDescriptorName=api",
                 "Service=cairn.service"]:
        assert line in socket_unit


def test_example_config_loads():
    from cairn.daemon.service.config import load_settings

    s = load_settings({"config": str(UNITS / "cairn.toml.example")}, env={})
    assert s.socket == "/run/cairn/cairn.sock" and s.checkpoint_dir == "/var/lib/cairn/checkpoints" and s.tcp is None


# What the daemon's process does that a seccomp filter could trip over: interpreter start-up, imports
# of every native dependency, BLAS in a worker thread, a libffi callback (threadpoolctl uses one),
# the notify socket. The W+X map and the AF_INET socket must be refused, like under systemd.
PROBE = textwrap.dedent("""
    import ctypes, mmap, socket
    try:
        mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        print("W+X allowed")
    except PermissionError:
        print("W+X refused")
    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        print("AF_INET allowed")
    except OSError:
        print("AF_INET refused")
    import numpy as np, threadpoolctl, trio, hypercorn.trio, structlog, tokenizers, jinja2
    import cairn.daemon.cli.main
    try:
        import cairn._kernel  # loads libgomp too; an ImportError (kernel not built) is not ours
    except ImportError:
        pass
    from cairn.daemon.service import systemd
    a = np.ones((256, 256), dtype=np.float32)
    with threadpoolctl.threadpool_limits(1):
        assert trio.run(trio.to_thread.run_sync, lambda: float((a @ a).sum())) == 256.0 ** 3
    assert ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(lambda x: x + 1)(41) == 42
    import os, tempfile
    with tempfile.TemporaryDirectory() as d:  # the checkpoint writer's pattern: write, fsync, rename, fsync dir
        fd = os.open(os.path.join(d, ".x.tmp"), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        os.write(fd, b"x"); os.fsync(fd); os.close(fd)
        os.replace(os.path.join(d, ".x.tmp"), os.path.join(d, "x"))
        dfd = os.open(d, os.O_RDONLY); os.fsync(dfd); os.close(dfd)
    print("notify", systemd.ready())
    print("done")
""")


@needs_systemd_tools
def test_process_runs_under_the_units_seccomp_filters(notify_socket):
    """SystemCallFilter=, MemoryDenyWriteExecute= and RestrictAddressFamilies= as systemd 252 installs
    them (scripts/sandbox-exec.py), strict: a syscall outside the allow list kills the process."""
    r = subprocess.run([sys.executable, str(SANDBOX), "--strict", "--", sys.executable, "-c", PROBE],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr}"
    assert r.stdout.split("\n") == ["W+X refused", "AF_INET refused", "notify True", "done", ""]
    assert notify_socket.recv(4096) == b"READY=1"


@needs_systemd_tools
def test_sandbox_kills_a_forbidden_syscall():
    """The sandbox is real: chown (@privileged, denied by the unit) kills the process in strict mode."""
    r = subprocess.run([sys.executable, str(SANDBOX), "--strict", "--", sys.executable, "-c",
                        "import os; os.chown('/', 0, 0)"], capture_output=True, timeout=60)
    assert r.returncode == -31  # SIGSYS


# --- scale-out: the template unit and the gateway unit (docs/operations.md "Scale-out") ----------

@pytest.fixture
def scale_out_units(tmp_path):
    """cairn@.service and cairn-gateway.service with ExecStart pointed at this venv's cairn and smg."""
    cairn = Path(sys.executable).with_name("cairn")
    smg = Path(sys.executable).with_name("smg")
    assert smg.exists(), "smg comes with the gateway test extra (make install)"
    template = (UNITS / "cairn@.service").read_text()
    assert "\nExecStart=/usr/local/bin/cairn serve --config /etc/cairn/%i.toml" in template
    (tmp_path / "cairn@.service").write_text(template.replace("/usr/local/bin/cairn", str(cairn)))
    gateway = (UNITS / "cairn-gateway.service").read_text()
    assert "\nExecStart=/usr/local/bin/smg launch " in gateway
    (tmp_path / "cairn-gateway.service").write_text(gateway.replace("/usr/local/bin/smg", str(smg)))
    return tmp_path


@needs_systemd_tools
def test_scale_out_units_verify(scale_out_units):
    """An instance of the template and the gateway unit pass `systemd-analyze verify`."""
    r = subprocess.run([ANALYZE, "verify", str(scale_out_units / "cairn@a.service"),
                        str(scale_out_units / "cairn-gateway.service")],
                       capture_output=True, text=True, timeout=60, cwd=scale_out_units)
    # the gateway Wants= instances of the template; verify resolves them from the same directory
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_scale_out_instances_share_one_user_and_listen_on_tcp_for_the_gateway():
    template = (UNITS / "cairn@.service").read_text().splitlines()
    for line in ["Type=notify", "WatchdogSec=30", "User=cairn-shared", "Group=cairn-shared",
                 "StateDirectory=cairn-%i", "RuntimeDirectory=cairn-%i", "ReadWritePaths=/srv/cairn/shared",
                 "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6", "IPAddressAllow=localhost",
                 "MemoryDenyWriteExecute=yes"]:
        assert line in template
    assert not any(line.startswith("DynamicUser=") for line in template)   # per-instance ids could not share files
    # the key: instances require it (no "-": a missing key file stops the start), the gateway sends it
    assert "EnvironmentFile=/etc/cairn/api_key.env" in template
    assert "EnvironmentFile=/etc/cairn/api_key.env" in (UNITS / "cairn-gateway.service").read_text().splitlines()
    sysusers = (UNITS / "cairn.sysusers.conf").read_text().splitlines()
    assert any(line.split()[:2] == ["u", "cairn-shared"] for line in sysusers)


def test_gateway_unit_command_parses_with_the_installed_smg():
    """The flags in cairn-gateway.service are ones this smg accepts, with the values it allows: they go
    through smg's own argument parser (an unknown flag or a bad choice exits 2)."""
    from smg.launch_router import parse_router_args

    unit = (UNITS / "cairn-gateway.service").read_text()
    start = unit.index("ExecStart=/usr/local/bin/smg ") + len("ExecStart=/usr/local/bin/smg ")
    command = unit[start:].split("\nRestart=")[0].replace("\\\n", " ").split()
    assert command[0] == "launch"
    args = parse_router_args(command[1:])
    assert args.policy == "cache_aware" and args.worker_urls == ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    assert args.host == "127.0.0.1" and args.prometheus_host == "127.0.0.1"
    assert args.api_key == "${CAIRN_API_KEY}"        # systemd expands it from the EnvironmentFile=
    with pytest.raises(SystemExit) as e:
        parse_router_args(command[1:] + ["--no-such-flag"])
    assert e.value.code == 2
