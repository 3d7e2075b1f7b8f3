"""Session fixtures for the native kernel tests; the HF oracle bridge lives in hf_oracle.py."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from hf_oracle import CONFIGS, LongOracle, Oracle, get_long_oracle, get_oracle  # noqa: E402


@pytest.fixture(scope="session", params=list(CONFIGS))
def oracle(request) -> Oracle:
    return get_oracle(request.param)


@pytest.fixture(scope="session")
def small_oracle() -> Oracle:
    return get_oracle("w16-hca16")


@pytest.fixture(scope="session")
def long_oracle() -> LongOracle:
    return get_long_oracle()
