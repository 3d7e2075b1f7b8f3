"""Shared fixtures: generated model directories. (Daemon harness and raw HTTP client: daemon_harness.py.)

Rules for the tests here: every I/O test runs under `trio.fail_after`; sockets are Unix sockets in a
temporary directory; the fake kernel (tests/fake_kernel.py) is used only where a test is about actor
logic, everything else runs the real kernel (skipped while it does not build yet).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import skip_policy  # noqa: E402

pytest_plugins = ("pytester",)   # tests/unit/test_skip_policy.py runs small suites in-process


def pytest_configure(config) -> None:
    skip_policy.register(config)   # a skip or xfail anywhere fails the run


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from cairn.daemon.make_model import make_model

    return make_model("tiny", 0, tmp_path_factory.mktemp("models") / "tiny")

