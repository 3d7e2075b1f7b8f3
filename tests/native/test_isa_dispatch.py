"""One build, every CPU: the install holds the kernel for each x86-64 level and `cairn._kernel` is
the best one this CPU runs (cairn/isa.py). Each level gives the model's logits: the fused-multiply-add
levels bit for bit alike, the SSE4.2 one within the fp32 tolerance."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cairn._kernel as K
from cairn.daemon.modelgen.make_model import make_model
from cairn import _cpu
from cairn.isa import KERNEL_DIR_ENV, LEVELS, built_levels, choose, cpu_flags, runnable

RUN = """
import sys, numpy as np
import cairn._kernel as K
from cairn.daemon.weights.model_dir import load_model
m = load_model(sys.argv[1], 2)
ids = np.random.default_rng(0).integers(0, 512, 300).astype(np.int32)
np.save(sys.argv[2], K.prefill(K.State(m), ids, chunk=64, all_logits=True)[1])
print(K.ISA)
"""


def test_the_loaded_kernel_is_the_best_level_this_cpu_runs():
    assert K.ISA == choose(cpu_flags(), built_levels())
    assert K.ISA == runnable(cpu_flags())[0]  # this machine's build holds every x86-64 level
    assert set(built_levels()) >= {"v2", "v3"} or built_levels() == ["base"]


def test_choice_follows_the_flags_and_refuses_what_cannot_run():
    v3 = LEVELS["v3"]
    assert choose(v3, ["v4", "v3", "v2"]) == "v3"
    assert choose(frozenset(), ["base"]) == "base"
    assert choose(LEVELS["v4"], ["v3", "v2"]) == "v3"         # not built: the next best
    with pytest.raises(ImportError, match="lacks os-zmm, x86-64-v4"):
        choose(v3, ["v4", "v3"], forced="v4")
    with pytest.raises(ImportError, match="not a kernel level"):
        choose(v3, ["v3"], forced="avx9")
    with pytest.raises(ImportError, match=r"no such kernel .*`make install` or `pip install .` every one"):
        choose(v3, ["v2"], forced="v3")


def test_each_level_needs_everything_the_level_below_needs():
    order = ["base", "v2", "v3", "v4"]
    for lower, upper in zip(order, order[1:]):
        assert LEVELS[lower] < LEVELS[upper], (lower, upper)
    # so a CPU that runs a level runs every level under it
    assert runnable(LEVELS["v4"]) == ["v4", "v3", "v2", "base"]


def test_registers_the_os_does_not_save_rule_out_their_level():
    # the CPU has AVX-512 (the compiler's check says x86-64-v4) but XCR0 lacks the ZMM state:
    # AVX-512 instructions would fault, so v3 is the best it runs; no AVX state at all: v2
    cpu = frozenset({"x86-64-v2", "x86-64-v3", "x86-64-v4"})
    assert runnable(cpu | {"os-ymm"})[0] == "v3"
    assert runnable(cpu)[0] == "v2"
    assert runnable(cpu | {"os-ymm", "os-zmm"})[0] == "v4"


def test_the_flags_are_the_compilers_check_of_this_cpu():
    flags = cpu_flags()
    assert flags == frozenset(_cpu.features())
    assert flags <= {"x86-64-v2", "x86-64-v3", "x86-64-v4", "os-ymm", "os-zmm"}
    if sys.platform == "linux" and os.uname().machine == "x86_64":
        assert "x86-64-v2" in flags  # every CPU these tests run on


def test_a_kernel_dir_supplies_the_module_it_holds(tmp_path):
    # CAIRN_KERNEL_DIR (the sanitizer build's way in): a level's module there replaces the installed one
    src = Path(K.__file__)
    (tmp_path / src.name).write_bytes(src.read_bytes())
    code = "import cairn._kernel as K; print(K.ISA, K.__file__)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, KERNEL_DIR_ENV: str(tmp_path), "CAIRN_ISA": K.ISA})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == [K.ISA, str(tmp_path / src.name)]
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, KERNEL_DIR_ENV: str(tmp_path / "absent")})
    assert r.returncode != 0 and "CAIRN_KERNEL_DIR" in r.stderr and "not a directory" in r.stderr


@pytest.fixture(scope="module")
def logits(tmp_path_factory):
    root = tmp_path_factory.mktemp("isa")
    model = make_model("tiny", 3, root / "tiny")
    out = {}
    for isa in runnable(cpu_flags()):
        if isa not in built_levels():
            continue
        path = root / f"{isa}.npy"
        r = subprocess.run([sys.executable, "-c", RUN, str(model), str(path)], capture_output=True, text=True,
                           env={**os.environ, "CAIRN_ISA": isa}, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        assert r.stdout.split()[-1] == isa
        out[isa] = np.load(path)
    return out


def test_every_level_this_cpu_runs_gives_the_models_logits(logits):
    assert {"v3", "v2"} <= set(logits)
    fused = [logits[i] for i in ("v4", "v3") if i in logits]
    assert all(np.array_equal(f.view(np.uint32), fused[0].view(np.uint32)) for f in fused)
    assert np.abs(logits["v2"] - fused[0]).max() < 1e-4
