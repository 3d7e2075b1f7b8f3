"""Run processes under a hard memory cap, in a memory cgroup of their own, and report what the group
saw: peak usage, how often the limit was hit, OOM kills. For tests that need a cap (the paged-expert
test, a daemon growing conversations to a limit), wherever the host lets the suite have one:

    with memory_cap(512 << 20, name="paging") as cap:
        proc = cap.popen([sys.executable, "worker.py"], stdout=subprocess.PIPE)   # joins before exec
        ...
        cap.oom_kills(), cap.peak_bytes(), cap.limit_hits()
    # on exit: whatever still runs in the group is killed, waited for, and the group removed

    reason = memory_cap_unavailable_reason()   # None, or what the host lacks and how to get it

Where the group is made (the first that applies):

 1. $CAIRN_TEST_CGROUP: a cgroup directory (v1 memory or v2) someone delegated to this user — it may
    create children there. On v2 the test run's own processes must be inside it (the kernel lets a
    process move another only within a subtree it may write the common ancestor of; systemd's
    Delegate=yes and .ci/run put the run there). On v1 any directory it may write works.
 2. cgroup v1 memory hierarchy, the own memory cgroup (/proc/self/cgroup) when writable (root), else
    the hierarchy's root when writable.
 3. cgroup v2 as root: the unified hierarchy's root (memory enabled there by systemd).
 4. cgroup v2, the own cgroup when it is delegated: owned by this user, memory among its controllers
    (`systemd-run --user --scope -p Delegate=yes CMD` makes one; `make test` runs the suite that way
    when a user manager runs and nothing else applies: `python tests/memory_cap.py wrap -- CMD`).

In a v2 group that holds processes itself, the memory controller cannot be enabled for children (no
internal processes), so those processes (the suite's own: make, pytest) are first moved into a leaf
child `cairn-leaf`, as a delegated subtree's manager does.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

ENV = "CAIRN_TEST_CGROUP"
WRAPPED_ENV = "CAIRN_MEMORY_CAP_WRAPPED"
HOW = ("a memory cgroup this user may create groups in. Any of: run as root; on a systemd machine with a "
       "user session, `make test` (it runs the suite in `systemd-run --user --scope -p Delegate=yes`); "
       "or have root delegate one and export CAIRN_TEST_CGROUP=<dir> (docs/validation.md, "
       "\"Host capabilities\")")
_counter = itertools.count()


class MemoryCapUnavailable(RuntimeError):
    pass



@dataclass(frozen=True)
class Base:
    """A cgroup directory caps are created in."""
    path: Path
    version: int           # 1: the v1 memory controller; 2: unified
    how: str               # which rule found it, for messages


# --- discovery ----------------------------------------------------------------------------------

def _own_cgroups(text: str | None = None) -> tuple[str | None, str | None]:
    """(v1 memory path, v2 path) of this process, from /proc/self/cgroup."""
    if text is None:
        text = Path("/proc/self/cgroup").read_text()
    v1 = v2 = None
    for line in text.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v1, v2


def _mounts(text: str | None = None) -> tuple[Path | None, Path | None]:
    """Mount points of the v1 memory hierarchy and of the unified (v2) hierarchy, from mountinfo."""
    if text is None:
        text = Path("/proc/self/mountinfo").read_text()
    v1 = v2 = None
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        if fields[3] != "/":          # a bind mount of a sub-group: not the hierarchy's root
            continue
        mnt, fstype, opts = Path(fields[4]), rfields[0], rfields[2].split(",")
        if fstype == "cgroup" and "memory" in opts and v1 is None:
            v1 = mnt
        elif fstype == "cgroup2" and v2 is None:
            v2 = mnt
    return v1, v2


def _version_of(d: Path) -> int | None:
    if (d / "memory.limit_in_bytes").exists():
        return 1
    if (d / "cgroup.controllers").exists():
        return 2
    return None


def _v2_has_memory(d: Path) -> bool:
    try:
        return "memory" in (d / "cgroup.controllers").read_text().split()
    except OSError:
        return False


def _writable(d: Path) -> bool:
    return os.access(d, os.W_OK | os.X_OK) and os.access(d / "cgroup.procs", os.W_OK)


def find_base() -> Base:
    """The directory caps go in (module docstring), or MemoryCapUnavailable saying what is missing."""
    own1, own2 = _own_cgroups()
    mnt1, mnt2 = _mounts()
    tried: list[str] = []

    env = os.environ.get(ENV)
    if env:
        d = Path(env)
        version = _version_of(d)
        if version is None:
            raise MemoryCapUnavailable(f"{ENV}={env}: not a cgroup directory (no memory.limit_in_bytes, "
                                       f"no cgroup.controllers)")
        if not _writable(d):
            raise MemoryCapUnavailable(f"{ENV}={env}: this user (uid {os.getuid()}) may not create groups "
                                       f"there (the directory and its cgroup.procs must be writable)")
        if version == 2 and not _v2_has_memory(d):
            raise MemoryCapUnavailable(f"{ENV}={env}: the memory controller is not enabled for it (its "
                                       f"parent's cgroup.subtree_control lacks +memory)")
        return Base(d, version, ENV)

    if mnt1 is not None:
        for d in ([mnt1 / own1.lstrip("/")] if own1 else []) + [mnt1]:
            if (d / "memory.limit_in_bytes").exists() and _writable(d):
                return Base(d, 1, "cgroup v1 memory hierarchy")
        tried.append(f"cgroup v1 memory hierarchy at {mnt1}: not writable by uid {os.getuid()}")
    if mnt2 is not None:
        if os.geteuid() == 0 and "memory" in _read(mnt2 / "cgroup.subtree_control").split():
            return Base(mnt2, 2, "cgroup v2 root")
        if not _v2_has_memory(mnt2) and not _v2_has_memory(mnt2 / (own2 or "/").lstrip("/")):
            tried.append(f"cgroup v2 at {mnt2}: no memory controller in it")
        elif own2 is not None:
            d = mnt2 / own2.lstrip("/")
            if d.exists() and d.stat().st_uid == os.getuid() and _writable(d) and _v2_has_memory(d):
                return Base(d, 2, "delegated cgroup v2")
            tried.append(f"own cgroup v2 {d}: not delegated to uid {os.getuid()} with the memory controller")
    if mnt1 is None and mnt2 is None:
        tried.append("no cgroup hierarchy mounted")
    raise MemoryCapUnavailable("; ".join(tried) or "no usable memory cgroup")


def _read(p: Path) -> str:
    try:
        return p.read_text()
    except OSError:
        return ""


def memory_cap_unavailable_reason() -> str | None:
    """None when memory_cap() works here; otherwise what is missing, and how to get it."""
    try:
        find_base()
    except MemoryCapUnavailable as e:
        return f"needs {HOW}; here: {e}"
    return None


# --- preparing a v2 base ------------------------------------------------------------------------

def _procs(d: Path) -> list[int]:
    return [int(x) for x in _read(d / "cgroup.procs").split()]


def _prepare_v2(base: Path) -> None:
    """Make `memory` available to base's children: enable it in cgroup.subtree_control, first moving
    the processes base holds itself into a leaf child (no internal processes in v2)."""
    if "memory" in _read(base / "cgroup.subtree_control").split():
        return
    if _procs(base):
        leaf = base / "cairn-leaf"
        leaf.mkdir(exist_ok=True)
        for _ in range(5):                     # processes may fork while they are moved
            pids = _procs(base)
            if not pids:
                break
            for pid in pids:
                try:
                    (leaf / "cgroup.procs").write_text(str(pid))
                except ProcessLookupError:
                    pass
                except OSError as e:
                    raise MemoryCapUnavailable(f"{base}: cannot move process {pid} into {leaf} ({e}), so the "
                                               "memory controller cannot be enabled for child groups") from e
    try:
        (base / "cgroup.subtree_control").write_text("+memory")
    except OSError as e:
        raise MemoryCapUnavailable(f"{base}: cannot enable +memory in cgroup.subtree_control ({e})") from e


# --- the cap --------------------------------------------------------------------------------------

class MemoryCap:
    """One memory cgroup with a hard limit; processes started with popen() run in it."""

    def __init__(self, base: Base, limit_bytes: int, name: str) -> None:
        self.base, self.version = base, base.version
        self.path = base.path / f"cairn-{name}-{os.getpid()}-{next(_counter)}"
        self.path.mkdir()
        self._procs: list[subprocess.Popen] = []
        try:
            if self.version == 1:
                (self.path / "memory.limit_in_bytes").write_text(str(int(limit_bytes)))
            else:
                (self.path / "memory.max").write_text(str(int(limit_bytes)))
                if (self.path / "memory.swap.max").exists():     # a cap on RAM, not RAM + swap
                    with contextlib.suppress(OSError):
                        (self.path / "memory.swap.max").write_text("0")
        except BaseException:
            self.path.rmdir()
            raise

    # -- starting processes
    def _join_fn(self, then=None):
        procs = str(self.path / "cgroup.procs")

        def join() -> None:            # in the child, before exec: everything it maps is charged here
            with open(procs, "w") as fh:
                fh.write(str(os.getpid()))
            if then is not None:
                then()
        return join

    def popen(self, argv, **kwargs) -> subprocess.Popen:
        """subprocess.Popen(argv, **kwargs), the child in this group from before its exec."""
        kwargs["preexec_fn"] = self._join_fn(kwargs.get("preexec_fn"))
        p = subprocess.Popen(argv, **kwargs)
        self._procs.append(p)
        return p

    def run(self, argv, *, timeout: float, **kwargs) -> subprocess.CompletedProcess:
        """Like subprocess.run(argv, timeout=..., **kwargs), in this group."""
        kwargs.setdefault("text", True)
        if kwargs.pop("capture_output", False):
            kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
        with self.popen(argv, **kwargs) as p:
            try:
                out, err = p.communicate(timeout=timeout)
            except BaseException:
                p.kill()
                p.wait()
                raise
        return subprocess.CompletedProcess(argv, p.returncode, out, err)

    # -- readings
    def _file(self, v1: str, v2: str) -> Path:
        return self.path / (v1 if self.version == 1 else v2)

    def _events(self) -> dict[str, int]:
        out = {}
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        for line in (self.path / name).read_text().splitlines():
            k, _, v = line.partition(" ")
            with contextlib.suppress(ValueError):
                out[k] = int(v)
        return out

    def limit_bytes(self) -> int:
        text = self._file("memory.limit_in_bytes", "memory.max").read_text().strip()
        return (1 << 63) - 1 if text == "max" else int(text)

    def usage_bytes(self) -> int:
        return int(self._file("memory.usage_in_bytes", "memory.current").read_text())

    def peak_bytes(self) -> int:
        """The group's peak charge (v1 memory.max_usage_in_bytes, v2 memory.peak: kernel 5.19+)."""
        p = self._file("memory.max_usage_in_bytes", "memory.peak")
        if not p.exists():
            raise MemoryCapUnavailable(f"{p}: no peak counter on this kernel (cgroup v2 memory.peak needs 5.19)")
        return int(p.read_text().split()[0])

    def oom_kills(self) -> int:
        """Processes the kernel's OOM killer killed in this group."""
        return self._events().get("oom_kill", 0)

    def limit_hits(self) -> int:
        """How often usage hit the limit (v1 memory.failcnt; v2 memory.events `max`)."""
        if self.version == 1:
            return int((self.path / "memory.failcnt").read_text())
        return self._events().get("max", 0)

    def under_oom(self) -> bool:
        """v1: a process is stopped waiting in the group's OOM handling (v2 has no such state)."""
        return self.version == 1 and self._events().get("under_oom", 0) == 1

    def pids(self) -> list[int]:
        return _procs(self.path)

    # -- teardown
    def kill(self) -> None:
        """SIGKILL everything in the group (v2: cgroup.kill where the kernel has it)."""
        if self.version == 2 and (self.path / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                (self.path / "cgroup.kill").write_text("1")
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def close(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                p.kill()
        self.kill()
        for p in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        # Exited children leave the group at once; their page cache charges move to the parent on rmdir.
        deadline = time.monotonic() + 10
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                self.kill()
                time.sleep(0.05)


_prepared: set[Path] = set()


@contextlib.contextmanager
def memory_cap(limit_bytes: int, name: str = "cap") -> Iterator[MemoryCap]:
    """A fresh memory cgroup limited to limit_bytes (module docstring). MemoryCapUnavailable when the
    host has none to give (memory_cap_unavailable_reason() says what and how)."""
    base = find_base()
    if base.version == 2 and base.path not in _prepared:
        _prepare_v2(base.path)
        _prepared.add(base.path)
    cap = MemoryCap(base, limit_bytes, name)
    try:
        yield cap
    finally:
        cap.close()


# --- running the whole suite where it can have a cap ----------------------------------------------

def _user_manager_scope_works() -> bool:
    if shutil.which("systemd-run") is None or os.geteuid() == 0:
        return False
    try:
        r = subprocess.run(["systemd-run", "--user", "--scope", "--quiet", "-p", "Delegate=yes", "--", "true"],
                           capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def wrap_argv(argv: list[str]) -> list[str]:
    """argv itself when caps work here (or a user manager cannot help); otherwise argv run in a
    delegated scope of the user's systemd manager, where the own cgroup is ours to divide."""
    if os.environ.get(WRAPPED_ENV) or memory_cap_unavailable_reason() is None or not _user_manager_scope_works():
        return argv
    # --scope: systemd-run execs argv itself, with this environment (main() marks it as wrapped)
    return ["systemd-run", "--user", "--scope", "--quiet", "-p", "Delegate=yes", "--collect", "--", *argv]


def main(args: list[str]) -> int:
    if args[:1] == ["reason"]:
        print(memory_cap_unavailable_reason() or f"available: {find_base()}")
        return 0
    if args[:2] == ["wrap", "--"] and len(args) > 2:
        argv = wrap_argv(args[2:])
        os.environ[WRAPPED_ENV] = "1"
        os.execvp(argv[0], argv)
    print("usage: memory_cap.py reason | wrap -- CMD ARGS...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
