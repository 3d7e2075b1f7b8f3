"""A fresh `make serve` builds the kernel for this CPU's level only (issue 42 §1), and says so while
it builds; a package build still builds every level (docs/architecture.md, "one build for every
CPU"). scripts/install.py picks the level and condenses pip's output; native/CMakeLists.txt takes
the level for one configure only."""

from __future__ import annotations

import importlib.util
import platform
import re
import subprocess
import sys
from pathlib import Path

import pybind11

from cairn.isa import cpu_flags, runnable

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _install_script():
    spec = importlib.util.spec_from_file_location("cairn_install_script", ROOT / "scripts" / "install.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_probe_before_install_picks_the_level_the_installed_kernel_picks():
    assert _install_script().host_level() == runnable(cpu_flags())[0]


def test_progress_says_the_phase_the_level_and_how_far(capsys):
    p = _install_script().Progress(clock=lambda: 7.0)     # no time passes: lines by tenths only
    for line in ["Collecting numpy>=1.26", "Collecting trio", "Building editable for cairn (pyproject.toml): started",
                 "  Running command Building editable for cairn (pyproject.toml)"]:
        p.feed(line)
    for i in range(1, 41):
        p.feed(f"  [{i}/40] Building CXX object CMakeFiles/_kernel_v3.dir/src/forward.cpp.o")   # as pip -v shows it
    out = capsys.readouterr().out.splitlines()
    assert sum("fetching the Python packages" in ln for ln in out) == 1
    assert sum("compiling the kernel" in ln for ln in out) == 1
    counts = [ln for ln in out if "files compiled" in ln]
    assert [c.split()[3] for c in counts] == ["1/40"] + [f"{4 * i}/40" for i in range(1, 11)]
    assert counts[-1] == "  [   0 s] 40/40 files compiled (now: kernel x86-64-v3)"


def _targets(build: Path, *defines: str) -> set[str]:
    subprocess.run([str(BIN / "cmake"), "-S", str(ROOT / "native"), "-B", str(build), "-G", "Ninja",
                    f"-DPython_EXECUTABLE={sys.executable}", f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
                    f"-DCMAKE_MAKE_PROGRAM={BIN / 'ninja'}", *defines],
                   check=True, capture_output=True, text=True, timeout=300)
    out = subprocess.run([str(BIN / "ninja"), "-C", str(build), "-t", "targets", "all"],
                         check=True, capture_output=True, text=True).stdout
    return set(re.findall(r"^(_kernel_\w+|_cpu):", out, re.M))


def test_one_level_for_one_configure_then_every_level_again(tmp_path):
    every = {"_kernel_v4", "_kernel_v3", "_kernel_v2"} if platform.machine() in ("x86_64", "AMD64") else {"_kernel_base"}
    one = sorted(every)[0]
    assert _targets(tmp_path, f"-DCAIRN_ISAS={one.removeprefix('_kernel_')}") == {one, "_cpu"}
    assert _targets(tmp_path) == every | {"_cpu"}     # same build directory, no define: not kept
