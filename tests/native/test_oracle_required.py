"""A missing HF oracle is an error that says how to install it, never a skip."""

import importlib
import sys

import pytest


@pytest.mark.parametrize("missing", ["torch", "transformers"])
def test_missing_oracle_is_an_import_error_naming_the_install(monkeypatch, missing):
    monkeypatch.setitem(sys.modules, missing, None)      # `import <missing>` raises ImportError
    monkeypatch.delitem(sys.modules, "hf_oracle")        # restored afterwards
    with pytest.raises(ImportError, match=r"make test.*pip install -e '\.\[oracle\]'"):
        importlib.import_module("hf_oracle")
