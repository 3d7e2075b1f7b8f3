"""Shared fixtures: one tiny generated model directory per test session (it is only read)."""

from __future__ import annotations

import pytest

from cairn.daemon.modelgen.make_model import make_model
from cairn.daemon.weights.model_dir import open_model_dir


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return make_model("tiny", 1, tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def tiny_md(tiny_dir):
    return open_model_dir(tiny_dir)
