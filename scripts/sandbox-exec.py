#!/usr/bin/env python3
"""Run a command under the seccomp policy of a systemd unit, without a running systemd.

    scripts/sandbox-exec.py [--unit systemd/cairn.service] [--strict] -- CMD ARGS...

Reads SystemCallFilter=, SystemCallErrorNumber=, RestrictAddressFamilies= and
MemoryDenyWriteExecute= from the unit and installs the same filters systemd 252 does (through
libseccomp, which Debian's systemd package depends on), then execs CMD: the whole process, from the
interpreter's first instruction on, runs as it would under the unit. Groups (@system-service, ...)
are expanded with `systemd-analyze syscall-filter`. Like systemd, each restriction is its own filter;
the kernel applies the strictest answer.

--strict kills the process on a syscall outside the allow list instead of failing it with
SystemCallErrorNumber=, so nothing that merely tolerates EPERM goes unnoticed.
Not reproduced: the dynamic user and empty capability set (the filters do not depend on them),
namespaces and mounts (ProtectSystem=, PrivateTmp=, ...), which need a manager.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import os
import subprocess
import sys
from pathlib import Path

ACT_KILL_PROCESS, ACT_ALLOW = 0x80000000, 0x7FFF0000
CMP_NE, CMP_MASKED_EQ = 1, 7
PROT_WRITE, PROT_EXEC, SHM_EXEC = 0x2, 0x4, 0o100000
PR_SET_NO_NEW_PRIVS = 38
FAMILIES = {"AF_UNIX": 1, "AF_LOCAL": 1, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16, "AF_PACKET": 17}


def act_errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


class ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("a", ctypes.c_uint64), ("b", ctypes.c_uint64)]


def unit_settings(unit: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and not key.startswith("#"):
            out.setdefault(key, []).append(value.strip())
    return out


def syscall_groups() -> dict[str, list[str]]:
    text = subprocess.run(["systemd-analyze", "syscall-filter"], check=True, capture_output=True, text=True).stdout
    groups: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("@"):
            current = groups.setdefault(line.split()[0], [])
        elif current is not None and line.strip() and not line.strip().startswith("#"):
            current.append(line.split()[0])
    return groups


def expand(names: list[str], groups: dict[str, list[str]]) -> set[str]:
    out: set[str] = set()
    for name in names:
        out |= expand(groups[name], groups) if name.startswith("@") else {name}
    return out


class Filter:
    def __init__(self, lib, default_action: int) -> None:
        self.lib, self.ctx = lib, lib.seccomp_init(default_action)
        if not self.ctx:
            raise OSError("seccomp_init failed")

    def add(self, action: int, name: str, *cmps: ArgCmp) -> None:
        nr = self.lib.seccomp_syscall_resolve_name(name.encode())
        if nr < 0:  # unknown here or not a native syscall (mmap2, ...): nothing to add
            return
        arr = (ArgCmp * len(cmps))(*cmps) if cmps else None
        rc = self.lib.seccomp_rule_add_array(self.ctx, action, nr, len(cmps), arr)
        if rc < 0:
            raise OSError(-rc, f"seccomp_rule_add {name}: {os.strerror(-rc)}")

    def load(self) -> None:
        rc = self.lib.seccomp_load(self.ctx)
        if rc < 0:
            raise OSError(-rc, f"seccomp_load: {os.strerror(-rc)}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--unit", type=Path, default=Path(__file__).resolve().parents[1] / "systemd" / "cairn.service")
    p.add_argument("--strict", action="store_true")
    p.add_argument("command", nargs="+")
    args = p.parse_args()

    lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(ArgCmp)]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]

    unit, groups = unit_settings(args.unit), syscall_groups()
    filters = []
    allowed: set[str] = set()
    for line in unit.get("SystemCallFilter", []):
        if line.startswith("~"):
            allowed -= expand(line[1:].split(), groups)
        else:
            allowed |= expand(line.split(), groups)
    if allowed:
        errno_name = (unit.get("SystemCallErrorNumber") or ["EPERM"])[-1]
        f = Filter(lib, ACT_KILL_PROCESS if args.strict else act_errno(getattr(errno, errno_name)))
        for name in sorted(allowed):
            f.add(ACT_ALLOW, name)
        filters.append(f)
    if (unit.get("MemoryDenyWriteExecute") or ["no"])[-1] == "yes":
        f = Filter(lib, ACT_ALLOW)
        deny = act_errno(errno.EPERM)
        for name in ("mmap", "mmap2"):
            f.add(deny, name, ArgCmp(2, CMP_MASKED_EQ, PROT_WRITE | PROT_EXEC, PROT_WRITE | PROT_EXEC))
        for name in ("mprotect", "pkey_mprotect"):
            f.add(deny, name, ArgCmp(2, CMP_MASKED_EQ, PROT_EXEC, PROT_EXEC))
        f.add(deny, "shmat", ArgCmp(2, CMP_MASKED_EQ, SHM_EXEC, SHM_EXEC))
        filters.append(f)
    families = unit.get("RestrictAddressFamilies")
    if families and not families[-1].startswith("~"):
        keep = sorted({FAMILIES[name] for line in families for name in line.split()})
        if len(keep) != 1:
            raise SystemExit("sandbox-exec: only a single allowed address family is implemented")
        f = Filter(lib, ACT_ALLOW)
        f.add(act_errno(errno.EAFNOSUPPORT), "socket", ArgCmp(0, CMP_NE, keep[0], 0))
        filters.append(f)

    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    for f in filters[1:] + filters[:1]:  # the allow list last: it may not allow seccomp(2) itself
        f.load()
    os.execvp(args.command[0], args.command)


if __name__ == "__main__":
    sys.exit(main())
