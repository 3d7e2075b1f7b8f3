"""The suite fails on any skip or xfail (tests/skip_policy.py): checked on small suites run in-process."""

from __future__ import annotations

import pytest


def _run(pytester, source: str):
    pytester.makepyfile(test_some=source)
    return pytester.runpytest_inprocess("-p", "skip_policy_plugin", "-q")


@pytest.fixture
def with_policy(pytester):
    # the inner run loads the same plugin the real suite registers
    pytester.makepyfile(skip_policy_plugin="""
import skip_policy

def pytest_configure(config):
    skip_policy.register(config)
""")
    pytester.syspathinsert()
    return pytester


def test_a_skipped_test_fails_the_run(with_policy):
    r = _run(with_policy, "import pytest\ndef test_ok(): pass\ndef test_s(): pytest.skip('no oracle')\n")
    r.assert_outcomes(passed=1, skipped=1)
    assert r.ret == pytest.ExitCode.TESTS_FAILED
    r.stdout.fnmatch_lines(["*skips and xfails fail this suite*", "*skipped: test_some.py::test_s*no oracle*"])


def test_an_xfail_and_a_module_skipped_at_collection_fail_the_run(with_policy):
    r = _run(with_policy, "import pytest\n@pytest.mark.xfail(reason='later')\ndef test_x(): assert 0\n")
    assert r.ret == pytest.ExitCode.TESTS_FAILED
    r.stdout.fnmatch_lines(["*xfailed: test_some.py::test_x*later*"])
    with_policy.makepyfile(test_other="import pytest\npytest.importorskip('no_such_module_here')\n")
    r = with_policy.runpytest_inprocess("-p", "skip_policy_plugin", "-q", "test_other.py")
    assert r.ret == pytest.ExitCode.TESTS_FAILED
    r.stdout.fnmatch_lines(["*skipped: *no_such_module_here*"])


def test_a_clean_run_still_passes(with_policy):
    r = _run(with_policy, "def test_ok(): pass\n")
    r.assert_outcomes(passed=1)
    assert r.ret == pytest.ExitCode.OK


# --- what the host cannot do: named in the summary; fails only under CI -----------------------------

HOST_CANNOT_SUITE = """
import pytest
from skip_policy import host_cannot

def test_ok(): pass

def test_capped():
    host_cannot("a delegated memory cgroup (export CAIRN_TEST_CGROUP=...)")

def test_tools():
    host_cannot("systemd-analyze (apt-get install systemd)")
"""


def test_what_the_host_cannot_do_is_named_and_does_not_fail_the_run_outside_ci(with_policy, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    r = _run(with_policy, HOST_CANNOT_SUITE)
    r.assert_outcomes(passed=1, skipped=2)
    assert r.ret == pytest.ExitCode.OK
    r.stdout.fnmatch_lines(["*host cannot run 2 tests (not a failure here; CI requires them)*",
                            "host cannot run: test_some.py::test_capped — a delegated memory cgroup "
                            "(export CAIRN_TEST_CGROUP=...)",
                            "host cannot run: test_some.py::test_tools — systemd-analyze (apt-get install systemd)"])
    assert "skips and xfails fail this suite" not in r.stdout.str()


def test_what_the_host_cannot_do_fails_under_ci(with_policy, monkeypatch):
    monkeypatch.setenv("CI", "true")
    r = _run(with_policy, HOST_CANNOT_SUITE)
    r.assert_outcomes(passed=1, failed=2)
    assert r.ret == pytest.ExitCode.TESTS_FAILED
    r.stdout.fnmatch_lines(["*test_capped*host cannot run this, and CI requires it: a delegated memory cgroup*"])
    # a host-cannot skip raised some other way is a plain failing skip under CI
    with_policy.makepyfile(test_raw="import pytest\ndef test_r(): pytest.skip('host cannot: a GPU')\n")
    r = with_policy.runpytest_inprocess("-p", "skip_policy_plugin", "-q", "test_raw.py")
    assert r.ret == pytest.ExitCode.TESTS_FAILED
    r.stdout.fnmatch_lines(["*skipped: test_raw.py::test_r*host cannot: a GPU*CI=true*"])


def test_other_skips_still_fail_next_to_what_the_host_cannot_do(with_policy, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    r = _run(with_policy, HOST_CANNOT_SUITE + "\ndef test_s(): pytest.skip('no oracle')\n")
    r.assert_outcomes(passed=1, skipped=3)
    assert r.ret == pytest.ExitCode.TESTS_FAILED
    r.stdout.fnmatch_lines(["*host cannot run 2 tests*", "*skips and xfails fail this suite*",
                            "*skipped: test_some.py::test_s*no oracle*"])
