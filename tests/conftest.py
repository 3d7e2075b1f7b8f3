"""Shared fixtures: generated model directories. (Daemon harness and raw HTTP client: daemon_harness.py.)

Rules for the tests here: every wait on I/O is bounded (`trio.fail_after` in Trio tests, a timeout on
each subprocess or socket wait otherwise); sockets are Unix sockets in a temporary directory; the fake
kernel (tests/fake_kernel.py) is used only where a test is about actor logic, everything else runs the
real kernel, which `make install` builds. Nothing is skipped: a missing build or a missing HF oracle
(torch / transformers) is an error, and any skip or xfail fails the run (tests/skip_policy.py).
"""

from __future__ import annotations

import os
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
    from cairn.daemon.modelgen.make_model import make_model

    return make_model("tiny", 0, tmp_path_factory.mktemp("models") / "tiny")



@pytest.fixture(scope="session")
def experts_dir(tmp_path_factory) -> Path:
    """The experts-fp4 preset: FP4 routed experts ~90 % of ~115 MB (paged-expert tests)."""
    from cairn.daemon.modelgen.make_model import make_model

    return make_model("experts-fp4", 0, tmp_path_factory.mktemp("models_e") / "experts-fp4")


@pytest.fixture(scope="session")
def tiny_model_dir_b(tmp_path_factory) -> Path:
    """A second tiny model: same shapes, other weights (seed 1), so another fingerprint."""
    from cairn.daemon.modelgen.make_model import make_model

    return make_model("tiny", 1, tmp_path_factory.mktemp("models_b") / "tiny")   # served as "tiny" too


@pytest.fixture(scope="session", autouse=True)
def _state_home(tmp_path_factory):
    """Daemons started by tests (in-process or `cairn serve`) keep their default state directory
    (checkpoints, the weight-digest cache) in a temporary directory, never in $HOME."""
    old = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))
    yield
    if old is None:
        os.environ.pop("XDG_STATE_HOME", None)
    else:
        os.environ["XDG_STATE_HOME"] = old
