"""Every stored format on every instruction-set path: the panel kernel (packed.cpp, formats/,
codecs/) built for x86-64-v2 (SSE4.2, no FMA), x86-64-v3 (AVX2 + FMA + F16C), x86-64-v4 (AVX-512,
where the CPU has it) and aarch64 (NEON, run under qemu-user), each checked against fp32 panels
of the same dequantized weights (isa_harness.cpp). The builds with fused multiply-adds give the
same bits as each other, whatever the CPU."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from skip_policy import host_cannot

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "tests/native/isa_harness.cpp", ROOT / "native/src/packed.cpp",
           *sorted((ROOT / "native/src/formats").glob("*.cpp")), *sorted((ROOT / "native/src/codecs").glob("*.cpp"))]
# -ffp-contract=off: as native/CMakeLists.txt builds the codecs and packed.cpp (their products and
# differences round apart, as numpy's do); the micro-kernel's accumulate is an explicit fma anyway.
FLAGS = ["-std=gnu++17", "-O1", "-ffp-contract=off", "-fopenmp", "-Wno-psabi", f"-I{ROOT / 'native/include'}"]


def _levels() -> list[str]:
    """The x86-64 levels this CPU can run (AVX-512 only where it exists)."""
    flags = set(Path("/proc/cpuinfo").read_text().split())
    return ["x86-64-v2", "x86-64-v3"] + (["x86-64-v4"] if "avx512f" in flags else [])


def _run(cmd: list[str], tmp_path: Path, exe: Path, runner: list[str]) -> str:
    build = subprocess.run([*cmd, *FLAGS, *map(str, SOURCES), "-o", str(exe)], capture_output=True, text=True,
                           timeout=600)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([*runner, str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "bit-identical" in run.stdout, run.stdout + run.stderr
    return next(line.split()[1] for line in run.stdout.splitlines() if line.startswith("digest"))


@pytest.fixture(scope="module")
def digests(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("isa")
    cxx = shutil.which("c++") or shutil.which("g++")
    assert cxx, "a C++ compiler is needed to build the kernel, and so this test"
    return {lvl: _run([cxx, f"-march={lvl}"], tmp, tmp / lvl, []) for lvl in _levels()}


def test_every_format_is_bit_identical_to_fp32_panels_on_every_x86_level(digests):
    assert set(digests) == set(_levels())


def test_levels_with_fused_multiply_adds_give_the_same_bits(digests):
    fused = {lvl: d for lvl, d in digests.items() if lvl != "x86-64-v2"}
    assert len(set(fused.values())) == 1, fused


def test_aarch64_build_runs_and_gives_the_bits_of_x86(digests, tmp_path):
    cxx, qemu = shutil.which("aarch64-linux-gnu-g++"), shutil.which("qemu-aarch64")
    if not (cxx and qemu):
        host_cannot("an aarch64 cross compiler and qemu-user (apt-get install g++-aarch64-linux-gnu qemu-user; "
                    "scripts/ensure-systemd-tools.sh does it as root)")
    arm = _run([cxx, "-static"], tmp_path, tmp_path / "harness-aarch64", [qemu])
    assert arm == digests["x86-64-v3"]
