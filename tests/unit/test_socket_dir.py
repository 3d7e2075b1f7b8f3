"""Socket directory trust: the daemon will not bind, and the client will not connect to the default
path, in a directory another user owns or can write to (they could swap the socket and read prompts).
"Another user": as root, a chown to an unused uid; as an ordinary user, who cannot give a directory
away, the directory is the user's own and the code under test runs as another uid (os.geteuid
reports one): the same lstat() result against the same rule, from the other side."""

from __future__ import annotations

import argparse
import os

import pytest

from cairn.daemon.cli.main import main as cli_main
from cairn.daemon.cli.client import ClientError, socket_path
from cairn.daemon.api.server import _unix_socket
from cairn.daemon.service.socket_dir import SocketDirError

OTHER_UID = 54321


@pytest.fixture
def owned_by_another(monkeypatch):
    """make(path, mode) -> the uid that owns the new directory `path`, a user other than the one the
    code under test runs as (module docstring)."""
    def make(path, mode: int) -> int:
        path.mkdir(mode=mode)
        os.chmod(path, mode)
        if os.geteuid() == 0:
            os.chown(path, OTHER_UID, OTHER_UID)
            return OTHER_UID
        owner = os.geteuid()
        monkeypatch.setattr(os, "geteuid", lambda: owner + 1)
        return owner
    return make


def test_daemon_refuses_socket_dir_owned_by_another_user(tmp_path, owned_by_another):
    theirs = tmp_path / "cairn-0"
    owner = owned_by_another(theirs, 0o700)       # a /tmp/cairn-$UID pre-made by someone else
    with pytest.raises(SocketDirError, match=rf"{theirs} is owned by uid {owner}, not by you .*"
                                             r"read the requests .*directory you own \(--socket / CAIRN_SOCKET\)"):
        _unix_socket(str(theirs / "cairn.sock"), 0o660)
    assert not (theirs / "cairn.sock").exists()


@pytest.mark.parametrize("mode, writers", [(0o777, "group and others"), (0o1777, "group and others"),
                                           (0o770, "group"), (0o703, "others")])
def test_daemon_refuses_group_or_world_writable_socket_dir(tmp_path, mode, writers):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, mode)                        # sticky (1777, like /tmp) is no better
    with pytest.raises(SocketDirError, match=rf"is writable by {writers} \(mode {mode:04o}\).*chmod go-w {shared}"):
        _unix_socket(str(shared / "cairn.sock"), 0o660)
    assert not (shared / "cairn.sock").exists()


def test_daemon_refuses_symlinked_socket_dir(tmp_path):
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(SocketDirError, match="is a symlink"):
        _unix_socket(str(tmp_path / "link" / "cairn.sock"), 0o660)


def test_daemon_creates_and_accepts_its_own_socket_dir(tmp_path):
    sock = _unix_socket(str(tmp_path / "run" / "cairn" / "cairn.sock"), 0o660)
    try:
        assert os.stat(tmp_path / "run" / "cairn").st_mode & 0o777 == 0o750
        assert os.stat(tmp_path / "run" / "cairn" / "cairn.sock").st_mode & 0o777 == 0o660
    finally:
        sock.close()


def _default_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("CAIRN_SOCKET", raising=False)
    monkeypatch.delenv("RUNTIME_DIRECTORY", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    return tmp_path / "cairn"                     # default socket: $XDG_RUNTIME_DIR/cairn/cairn.sock


def test_client_refuses_default_socket_in_a_dir_owned_by_another_user(tmp_path, monkeypatch, capsys,
                                                                     owned_by_another):
    d = _default_dir(tmp_path, monkeypatch)
    owner = owned_by_another(d, 0o755)
    with pytest.raises(ClientError, match=rf"refusing the default socket {d}/cairn.sock: .*owned by uid {owner}"):
        socket_path(argparse.Namespace(socket=None))
    assert cli_main(["status"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("cairn status: refusing the default socket") and "--socket / CAIRN_SOCKET" in err


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o775])
def test_client_refuses_default_socket_in_a_writable_dir(tmp_path, monkeypatch, mode):
    d = _default_dir(tmp_path, monkeypatch)
    d.mkdir()
    os.chmod(d, mode)
    with pytest.raises(ClientError, match=r"refusing the default socket .*is writable by .*chmod go-w"):
        socket_path(argparse.Namespace(socket=None))


def test_client_default_socket_in_own_dir_or_missing_dir_is_used(tmp_path, monkeypatch):
    d = _default_dir(tmp_path, monkeypatch)
    assert socket_path(argparse.Namespace(socket=None)) == str(d / "cairn.sock")   # missing: "cannot reach" later
    d.mkdir(mode=0o700)
    assert socket_path(argparse.Namespace(socket=None)) == str(d / "cairn.sock")


def test_client_uses_a_socket_path_the_user_gave_as_is(tmp_path, monkeypatch):
    """--socket / CAIRN_SOCKET are the user's choice (e.g. /run/cairn/cairn.sock, owned by the service's
    dynamic user): not second-guessed."""
    d = _default_dir(tmp_path, monkeypatch)
    d.mkdir()
    os.chmod(d, 0o777)
    assert socket_path(argparse.Namespace(socket="/elsewhere/c.sock")) == "/elsewhere/c.sock"
    monkeypatch.setenv("CAIRN_SOCKET", str(d / "cairn.sock"))
    assert socket_path(argparse.Namespace(socket=None)) == str(d / "cairn.sock")


def test_serve_refuses_an_unsafe_socket_dir_before_loading_the_model(tmp_path, monkeypatch, capsys):
    """A real model loads for minutes: the socket directory is checked first."""
    from cairn.daemon.service.config import load_settings
    from cairn.daemon.service.main import serve

    monkeypatch.delenv("LISTEN_FDS", raising=False)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    loads = []
    settings = load_settings({"model": "m", "socket": str(shared / "cairn.sock")}, {})
    assert serve(settings, load_model=loads.append) == 1
    assert loads == []
    assert capsys.readouterr().err.startswith(f"cairn serve: socket directory {shared} is writable by group and others")
