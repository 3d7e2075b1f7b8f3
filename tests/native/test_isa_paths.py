"""Every instruction-set path, on this machine: the kernel's sources built for x86-64-v2 (SSE4.2, no
FMA), x86-64-v3 (AVX2 + FMA + F16C), x86-64-v4 (AVX-512, where the CPU has it) and aarch64 (NEON, run
under qemu-user), with the flags native/CMakeLists.txt gives each file, and two programs linked
against each build:

- isa_harness.cpp: every stored format's panels (packed.cpp, formats/, codecs/) against fp32 panels
  of the same dequantized weights, bit for bit, with a digest of every product;
- forward_harness.cpp: the whole forward pass of two small random-weight models (DeepSeek-V4 and
  Qwen3.5), a digest of each one's logits.

The builds with fused multiply-adds (v3, v4, aarch64) give the same products and the same logits bit
for bit, whatever the CPU; v2 rounds its own way (its own numeric class)."""

from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cairn.isa import cpu_flags, runnable
from skip_policy import host_cannot

ROOT = Path(__file__).resolve().parents[2]
KERNEL = [p for p in sorted((ROOT / "native/src").rglob("*.cpp"))
          if not p.name.startswith("bind") and p.name not in ("module.cpp", "cpu.cpp")]
HARNESSES = {"products": ROOT / "tests/native/isa_harness.cpp", "logits": ROOT / "tests/native/forward_harness.cpp"}
# As native/CMakeLists.txt compiles them: the codecs, packed.cpp and rope.cpp without multiply-add
# contraction, the rest with GCC's default (-ffp-contract=fast). -O2, not the build's -O3, keeps four
# builds of the kernel to a few minutes; both contract and neither reorders a sum.
NO_CONTRACT = {ROOT / "native/src/packed.cpp", ROOT / "native/src/rope.cpp", *(ROOT / "native/src/codecs").glob("*.cpp")}
FLAGS = ["-std=gnu++17", "-O2", "-fopenmp", "-Wno-psabi", f"-I{ROOT / 'native/include'}"]


def _levels() -> list[str]:
    """The x86-64 levels this CPU can run (AVX-512 only where it exists)."""
    return [f"x86-64-{isa}" for isa in reversed(runnable(cpu_flags())) if isa != "base"]


def _build_and_run(cxx: list[str], out: Path, runner: list[str], link: list[str] = ()) -> dict[str, str]:
    """Both harnesses' digests for one target."""
    out.mkdir(parents=True, exist_ok=True)

    def compile_one(src: Path) -> Path:
        obj = out / (src.relative_to(ROOT).as_posix().replace("/", "_") + ".o")
        extra = ["-ffp-contract=off"] if src in NO_CONTRACT else []
        r = subprocess.run([*cxx, *FLAGS, *extra, "-c", str(src), "-o", str(obj)], capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, r.stderr[-4000:]
        return obj

    with ThreadPoolExecutor(2) as pool:
        objs = list(pool.map(compile_one, [*HARNESSES.values(), *KERNEL]))
    kernel_objs, digests = objs[len(HARNESSES):], {}
    for (name, _), main in zip(HARNESSES.items(), objs):
        exe = out / name
        r = subprocess.run([*cxx, "-fopenmp", *link, str(main), *map(str, kernel_objs), "-o", str(exe)],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-4000:]
        run = subprocess.run([*runner, str(exe)], capture_output=True, text=True, timeout=600)
        ok = "bit-identical" if name == "products" else "finite"
        assert run.returncode == 0 and ok in run.stdout, run.stdout + run.stderr
        for line in run.stdout.splitlines():
            key, _, value = line.partition(" ")
            if key == "digest":
                digests[name] = value
            elif key == "qwen35":                 # the logits harness's second model
                digests["qwen35 logits"] = value
            elif key == "fp8_float":              # Qwen's FP8 panels (a digest of their own: V4's are pinned)
                digests["fp8 float-scale products"] = value
    return digests


@pytest.fixture(scope="module")
def digests(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("isa")
    cxx = shutil.which("c++") or shutil.which("g++")
    assert cxx, "a C++ compiler is needed to build the kernel, and so this test"
    return {lvl: _build_and_run([cxx, f"-march={lvl}"], tmp / lvl, []) for lvl in _levels()}


@pytest.fixture(scope="module")
def aarch64(tmp_path_factory):
    cxx, qemu = shutil.which("aarch64-linux-gnu-g++"), shutil.which("qemu-aarch64")
    if not (cxx and qemu):
        host_cannot("an aarch64 cross compiler and qemu-user (apt-get install g++-aarch64-linux-gnu qemu-user; "
                    "scripts/ensure-systemd-tools.sh does it as root)")
    return _build_and_run([cxx], tmp_path_factory.mktemp("aarch64"), [qemu], link=["-static"])


def test_every_format_is_bit_identical_to_fp32_panels_on_every_x86_level(digests):
    assert set(digests) == set(_levels()) >= {"x86-64-v2", "x86-64-v3"}


def test_levels_with_fused_multiply_adds_give_the_same_bits(digests):
    fused = {lvl: d["products"] for lvl, d in digests.items() if lvl != "x86-64-v2"}
    assert len(set(fused.values())) == 1, fused


def test_levels_with_fused_multiply_adds_give_the_same_logits(digests):
    fused = {lvl: d["logits"] for lvl, d in digests.items() if lvl != "x86-64-v2"}
    assert len(set(fused.values())) == 1, fused


@pytest.mark.parametrize("key", ["qwen35 logits", "fp8 float-scale products"])
def test_levels_with_fused_multiply_adds_give_the_same_qwen35_bits(digests, key):
    fused = {lvl: d[key] for lvl, d in digests.items() if lvl != "x86-64-v2"}
    assert len(fused) >= 1 and len(set(fused.values())) == 1, fused


def test_aarch64_build_runs_and_gives_the_bits_of_x86(digests, aarch64):
    assert aarch64["products"] == digests["x86-64-v3"]["products"]


def test_aarch64_forward_pass_gives_the_logits_of_x86(digests, aarch64):
    assert aarch64["logits"] == digests["x86-64-v3"]["logits"]


@pytest.mark.parametrize("key", ["qwen35 logits", "fp8 float-scale products"])
def test_aarch64_gives_the_qwen35_bits_of_x86(digests, aarch64, key):
    assert aarch64[key] == digests["x86-64-v3"][key]
