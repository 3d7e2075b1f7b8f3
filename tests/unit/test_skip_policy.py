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
