"""HTTP serving: hypercorn's Trio worker over a Unix socket (mode 0660 by default), optional TCP.

Sockets are bound here (not by hypercorn) so the Unix socket's directory and mode are ours to set,
and `listen()` is called before `worker_serve(sockets=...)` (hypercorn does not call it itself).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

import trio
from hypercorn.config import Config, Sockets
from hypercorn.trio.run import worker_serve
from hypercorn.utils import wrap_app

from cairn.daemon.service.socket_dir import check_socket_dir, check_socket_free


def prepare_socket_dir(path: str) -> None:
    """Create the socket's directory if needed and check that it is safe (daemon/service/socket_dir.py)."""
    parent = Path(path).parent
    parent.mkdir(parents=True, mode=0o750, exist_ok=True)
    check_socket_dir(parent)              # ours and writable by us only, else the socket can be swapped


def _unix_socket(path: str, mode: int) -> socket.socket:
    p = Path(path)
    prepare_socket_dir(path)
    check_socket_free(p)                  # a live server or another file: refused, with the fix
    if p.is_socket():
        p.unlink()                        # stale socket from a previous run
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o777 & ~mode)         # no window where the socket is wider than asked
    try:
        sock.bind(str(p))
    finally:
        os.umask(old)
    os.chmod(p, mode)
    return sock


def _tcp_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    return sock


def check_inherited(inherited: list[socket.socket], api_key: str | None) -> None:
    """systemd may pass TCP sockets too (a drop-in's ListenStream=): the same rule as --tcp applies —
    a non-loopback address is refused unless an API key is set."""
    for s in inherited:
        if s.family in (socket.AF_INET, socket.AF_INET6) and api_key is None:
            host = s.getsockname()[0]
            if not ipaddress.ip_address(host).is_loopback:
                raise OSError(f"systemd passed a TCP socket on {host}, which is not loopback; "
                              "set api_key (--api-key / CAIRN_API_KEY) or listen on 127.0.0.1")


def make_sockets(unix_path: str | None, mode: int, tcp: tuple[str, int] | None,
                 inherited: list[socket.socket] = ()) -> Sockets:
    """Bind (and listen on) our sockets. `inherited`: already-listening sockets passed by systemd
    (socket activation); with them, no Unix socket of our own is bound (`unix_path` is None)."""
    socks = [_unix_socket(unix_path, mode)] if unix_path is not None else []
    if tcp is not None:
        socks.append(_tcp_socket(*tcp))
    for s in socks:
        s.listen(128)
    socks += list(inherited)
    for s in socks:
        s.setblocking(False)
    return Sockets(secure_sockets=[], insecure_sockets=socks, quic_sockets=[])


def hypercorn_config() -> Config:
    cfg = Config()
    cfg.accesslog = None
    cfg.errorlog = None
    cfg.keep_alive_timeout = 75
    cfg.graceful_timeout = 1.0
    cfg.wsgi_max_body_size = 64 * 1024 * 1024
    return cfg


async def serve_http(app, sockets: Sockets, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    cfg = hypercorn_config()
    await worker_serve(wrap_app(app, cfg.wsgi_max_body_size, "asgi"), cfg, sockets=sockets,
                       task_status=task_status)
