"""pytest plugin: a skipped or xfailed test fails the run.

A skip hides a test that did not run (a missing oracle, a missing tool) behind a green result, so
the run's exit status is set to failure when any test, or any module at collection, was skipped or
xfailed; the summary names each one and why. Registered by tests/conftest.py.
"""

from __future__ import annotations

import pytest


class SkipsFail:
    def __init__(self) -> None:
        self.skipped: list[str] = []

    def _note(self, report) -> None:
        if not report.skipped:
            return
        why = getattr(report, "wasxfail", None)
        kind = "xfailed" if why is not None else "skipped"
        if why is None:
            lr = report.longrepr
            why = lr[2] if isinstance(lr, tuple) and len(lr) == 3 else str(lr)
        self.skipped.append(f"{kind}: {report.nodeid or '(collection)'}: {why}")

    def pytest_runtest_logreport(self, report) -> None:
        self._note(report)

    def pytest_collectreport(self, report) -> None:
        self._note(report)

    def pytest_sessionfinish(self, session, exitstatus) -> None:
        if self.skipped and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.skipped:
            terminalreporter.section("skips and xfails fail this suite", sep="=", red=True, bold=True)
            for line in self.skipped:
                terminalreporter.line(line, red=True)


def register(config) -> None:
    config.pluginmanager.register(SkipsFail(), "cairn-skips-fail")
