"""The quantized micro-kernel on every ISA path: packed.cpp built for x86-64-v3 (AVX2 + FMA + F16C,
the AVX2-only machines), x86-64-v4 (AVX-512, where the CPU has it) and plain x86-64 (the portable loops), each run
against fp32 panels of the same dequantized weights (isa_harness.cpp)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _levels() -> list[str]:
    """The x86-64 levels this CPU can run (AVX-512 only where it exists)."""
    flags = set(Path("/proc/cpuinfo").read_text().split())
    return ["x86-64", "x86-64-v3"] + (["x86-64-v4"] if "avx512f" in flags else [])


@pytest.mark.parametrize("level", _levels())
def test_quantized_panels_are_bit_identical_on_every_isa_path(tmp_path, level):
    cxx = shutil.which("c++") or shutil.which("g++")
    assert cxx, "a C++ compiler is needed to build the kernel, and so this test"
    exe = tmp_path / "harness"
    build = subprocess.run(
        [cxx, "-std=c++17", "-O1", f"-march={level}", "-fopenmp", f"-I{ROOT / 'native/include'}",
         "-Wno-psabi", str(ROOT / "tests/native/isa_harness.cpp"), str(ROOT / "native/src/packed.cpp"),
         *map(str, sorted((ROOT / "native/src/formats").glob("*.cpp"))),
         *map(str, sorted((ROOT / "native/src/codecs").glob("*.cpp"))), "-o", str(exe)],
        capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "bit-identical" in run.stdout, run.stdout + run.stderr
