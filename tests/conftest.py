"""Shared fixtures: generated model directories, an in-process daemon, a raw HTTP client.

Rules for the tests here: every I/O test runs under `trio.fail_after`; sockets are Unix sockets in a
temporary directory; the fake kernel (tests/fake_kernel.py) is used only where a test is about actor
logic, everything else runs the real kernel (skipped while it does not build yet).
"""

from __future__ import annotations

import sys
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from cairn.daemon.make_model import make_model

    return make_model("tiny", 0, tmp_path_factory.mktemp("models") / "tiny")


def real_kernel_available() -> bool:
    try:
        from cairn import _kernel
    except ImportError:
        return False
    return all(hasattr(_kernel, n) for n in ("Model", "State", "AbortFlag", "prefill", "decode", "MAX_CHUNK"))


needs_real_kernel = pytest.mark.skipif(not real_kernel_available(), reason="cairn._kernel not built yet")
