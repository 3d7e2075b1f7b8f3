# The two commands a fresh machine needs: `make serve` and `make test`. Everything else is set-up.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
MODEL  ?= models/small
STAMP  := $(VENV)/.cairn-installed
NATIVE := $(shell find native -type f \( -name '*.cpp' -o -name '*.h' -o -name 'CMakeLists.txt' \) 2>/dev/null)

.PHONY: install serve test demo bench model clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# Build requirements go into the venv first so the extension builds without isolation and
# keeps its CMake build directory (build/) between installs: a rebuild after an edit is incremental.
$(STAMP): $(PY) pyproject.toml $(NATIVE)
	$(PIP) install -q scikit-build-core pybind11 scipy-openblas32 cmake ninja
	$(PIP) install -q --no-build-isolation -e '.[test,oracle]'
	touch $(STAMP)

install: $(STAMP)

test: install
	sh scripts/ensure-systemd-tools.sh
	$(PY) -m pytest -q tests

clean:
	rm -rf build $(VENV) .pytest_cache
