"""pytest plugin: a skipped or xfailed test fails the run — except what the host cannot do.

A skip hides a test that did not run (a missing oracle, a missing tool) behind a green result, so
the run's exit status is set to failure when any test, or any module at collection, was skipped or
xfailed; the summary names each one and why. Registered by tests/conftest.py.

One exception: a test that needs a capability of the host a contributor's machine may lack and cannot
get from the suite's own install (a memory cgroup to cap processes in, the systemd tools) calls
`host_cannot(what it needs and how to get it)`. Outside CI the test is not run, the run does not fail
for it, and the summary's "host cannot run" section names each such test and what it needs. Under CI
(CI=true) every capability is required: host_cannot() fails the test, and a host-cannot skip fails
the run like any other skip.

Only this module skips: tests/unit/test_no_plain_skips.py checks the suite's source (its syntax tree)
for any other pytest.skip / importorskip / xfail / skip marker, so a skip that only happens on some
hosts is caught on every host.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

HOST_CANNOT = "host cannot: "


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def host_cannot(needs: str) -> NoReturn:
    """The host lacks `needs` (say what, and how to get it). Outside CI: reported, not run, not a
    failure. Under CI: a failure."""
    __tracebackhide__ = True
    if in_ci():
        pytest.fail(f"host cannot run this, and CI requires it: {needs}", pytrace=False)
    pytest.skip(HOST_CANNOT + needs)


def systemd_tools_missing() -> str | None:
    """None when the systemd tools some tests run are here (systemd-socket-activate, systemd-analyze,
    libseccomp for scripts/sandbox-exec.py); otherwise what is missing and how to install it."""
    import ctypes.util
    import shutil

    missing = [t for t in ("systemd-socket-activate", "systemd-analyze") if shutil.which(t) is None]
    if ctypes.util.find_library("seccomp") is None:
        missing.append("libseccomp.so.2")
    if not missing:
        return None
    return (f"{', '.join(missing)} (Debian/Ubuntu packages systemd, libseccomp2: `sudo apt-get install "
            "systemd libseccomp2`, which `make test` does itself when run as root; no running systemd is needed)")


class SkipsFail:
    def __init__(self) -> None:
        self.skipped: list[str] = []
        self.host_cannot: dict[str, list[str]] = {}     # what is needed -> the tests that need it

    def _note(self, report) -> None:
        if not report.skipped:
            return
        why = getattr(report, "wasxfail", None)
        kind = "xfailed" if why is not None else "skipped"
        nodeid = report.nodeid or "(collection)"
        if why is None:
            lr = report.longrepr
            why = lr[2] if isinstance(lr, tuple) and len(lr) == 3 else str(lr)
            bare = why[len("Skipped: "):] if why.startswith("Skipped: ") else why
            if bare.startswith(HOST_CANNOT):
                if not in_ci():
                    self.host_cannot.setdefault(bare[len(HOST_CANNOT):], []).append(nodeid)
                    return
                why += " (CI=true: every capability is required)"
        self.skipped.append(f"{kind}: {nodeid}: {why}")

    def pytest_runtest_logreport(self, report) -> None:
        self._note(report)

    def pytest_collectreport(self, report) -> None:
        self._note(report)

    def pytest_sessionfinish(self, session, exitstatus) -> None:
        if self.skipped and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.host_cannot:
            n = sum(len(v) for v in self.host_cannot.values())
            terminalreporter.section(f"host cannot run {n} test{'s' * (n != 1)} (not a failure here; "
                                     "CI requires them)", sep="=", yellow=True, bold=True)
            for needs, nodeids in self.host_cannot.items():
                for nodeid in nodeids:
                    terminalreporter.line(f"host cannot run: {nodeid} — {needs}", yellow=True)
        if self.skipped:
            terminalreporter.section("skips and xfails fail this suite", sep="=", red=True, bold=True)
            for line in self.skipped:
                terminalreporter.line(line, red=True)


def register(config) -> None:
    config.pluginmanager.register(SkipsFail(), "cairn-skips-fail")
