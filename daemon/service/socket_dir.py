"""Whether a Unix socket's directory can be trusted; the daemon (before binding) and the client
(before connecting to the default path) apply the same rule.

Whoever can write to the directory can unlink the socket and bind their own in its place, then read
every prompt sent to it. So the directory must belong to the user (or to root: the system service's
/run/cairn) and be writable by its owner only. A sticky world-writable directory such as /tmp is
refused too: the sticky bit does not help when the attacker created the directory first (a
/tmp/cairn-$UID made by another user), and a socket directly in /tmp can be pre-empted by name.
"""

from __future__ import annotations

import os
import stat


class SocketDirError(OSError):
    """The socket's directory is not safe; the message says why and what to do."""


def socket_dir_problem(st: os.stat_result, uid: int) -> str | None:
    """What is wrong with a directory with this lstat() result for user `uid`, or None. Pure."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink (its target could be changed under us)"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid not in (uid, 0):
        return f"is owned by uid {st.st_uid}, not by you (uid {uid}) or root"
    writers = [who for who, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if st.st_mode & bit]
    if writers:
        return f"is writable by {' and '.join(writers)} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def check_socket_dir(directory: str | os.PathLike, *, uid: int | None = None) -> None:
    """Raise SocketDirError unless `directory` (which must exist) is safe for a socket of user `uid`
    (default: the effective uid)."""
    uid = os.geteuid() if uid is None else uid
    st = os.lstat(directory)
    problem = socket_dir_problem(st, uid)
    if problem is None:
        return
    if "owned by" in problem:
        fix = "remove it if it is not yours (as root) or use a socket path in a directory you own"
    elif "writable by" in problem and st.st_uid == uid:
        fix = f"run `chmod go-w {directory}`, or use a socket path in a directory of its own"
    else:
        fix = "use a socket path in a directory of its own, e.g. $XDG_RUNTIME_DIR/cairn/cairn.sock"
    raise SocketDirError(f"socket directory {directory} {problem}: another user could replace the socket "
                         f"and read the requests sent to it; {fix} (--socket / CAIRN_SOCKET)")


class SocketBusyError(OSError):
    """Something already stands at the socket path that binding must not replace; the message says
    what and how to fix it."""


def check_socket_free(path: str | os.PathLike) -> None:
    """Raise SocketBusyError when `path` holds a socket a server answers on, or a file that is not a
    socket. Nothing there, or a socket nobody answers on (left by a crashed run), is free: binding
    removes the stale one. `cairn serve` asks before the model loads (minutes for a real model) and
    again when it binds."""
    import socket

    p = os.fspath(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketBusyError(f"{p}: exists and is not a socket; refusing to replace it: remove it if it is "
                              "a leftover, or serve on another path with --socket PATH (CAIRN_SOCKET)")
    probe = socket.socket(socket.AF_UNIX)
    try:
        probe.connect(p)
    except OSError:
        return                        # stale: nobody listens there
    finally:
        probe.close()
    raise SocketBusyError(f"{p}: another server is already listening there; is another cairn daemon running "
                          "(`cairn status` asks it)? Stop it, or serve on another path "
                          "with --socket PATH (CAIRN_SOCKET)")
