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
	$(PIP) install -q scikit-build-core pybind11 cmake ninja
	$(PIP) install -q --no-build-isolation -e '.[test,oracle,gateway]'
	touch $(STAMP)

install: $(STAMP)

# The default demo model: generated once, deterministically (preset small, seed 0). The target is the
# last file make-model writes, so an interrupted generation is redone.
$(MODEL)/generation_config.json: | $(STAMP)
	$(VENV)/bin/cairn make-model --preset small --seed 0 $(MODEL)

model: $(MODEL)/generation_config.json

# Foreground daemon on the default Unix socket; prints the socket path and a curl example.
# Extra flags: make serve ARGS="--tcp 127.0.0.1:8000 --log-level debug"
serve: install $(MODEL)/generation_config.json
	$(VENV)/bin/cairn serve --model $(MODEL) $(ARGS)

# An agent session through the real socket: checkpoints off / in memory / from disk after a restart;
# prints TTFT per turn. Smaller run: make demo DEMO_ARGS="--system-tokens 2000 --turns 3"
demo: install $(MODEL)/generation_config.json
	$(PY) bench/agent_session.py --model $(MODEL) $(DEMO_ARGS)

# Kernel vs HF transformers, side by side (prefill, decode, snapshot/restore, machine limits).
bench: install $(MODEL)/generation_config.json
	$(PY) bench/kernel.py $(MODEL) --threads 2

test: install
	sh scripts/ensure-systemd-tools.sh
	$(PY) -m pytest -q tests

clean:
	rm -rf build $(VENV) .pytest_cache
