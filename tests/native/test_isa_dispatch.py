"""One build, every CPU: the install holds the kernel for each x86-64 level and `cairn._kernel` is
the best one this CPU runs (cairn/isa.py). Each level gives the model's logits: the fused-multiply-add
levels bit for bit alike, the SSE4.2 one within the fp32 tolerance."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import cairn._kernel as K
from cairn.daemon.modelgen.make_model import make_model
from cairn.isa import LEVELS, built_levels, choose, cpu_flags, runnable

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
    v3 = LEVELS["v3"] | LEVELS["v2"]
    assert choose(v3, ["v4", "v3", "v2"]) == "v3"
    assert choose(frozenset(), ["base"]) == "base"
    assert choose(v3 | LEVELS["v4"], ["v3", "v2"]) == "v3"         # not built: the next best
    with pytest.raises(ImportError, match="lacks avx512"):
        choose(v3, ["v4", "v3"], forced="v4")
    with pytest.raises(ImportError, match="not a kernel level"):
        choose(v3, ["v3"], forced="avx9")
    with pytest.raises(ImportError, match="no such kernel"):
        choose(v3, ["v2"], forced="v3")


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
