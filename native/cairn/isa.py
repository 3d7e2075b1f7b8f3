"""Which build of the kernel this CPU runs (cairn/_kernel.py loads it; native/CMakeLists.txt builds one
per level): plain policy over a set of feature names, so it is testable with any set.

The names come from `cairn._cpu` (native/src/cpu.cpp), the compiler's own check: "x86-64-v2" ..
"x86-64-v4" when `__builtin_cpu_supports` says the CPU has the whole psABI level (what
`-march=x86-64-vN` may emit), and "os-ymm" / "os-zmm" when XCR0 says the OS saves the AVX / AVX-512
registers. /proc/cpuinfo is not read: its flags name the CPU's features, not what the OS enabled, and
a hand-written list of them drifts from what the compiler emits.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

# what each level needs; each level's set holds the one below it, so a CPU that runs a level runs
# every level under it
_V2 = frozenset({"x86-64-v2"})
_V3 = _V2 | {"x86-64-v3", "os-ymm"}
_V4 = _V3 | {"x86-64-v4", "os-zmm"}
LEVELS: dict[str, frozenset[str]] = {"v4": _V4, "v3": _V3, "v2": _V2, "base": frozenset()}

# CAIRN_KERNEL_DIR: a directory of kernel modules (_kernel_<level>*.so) used instead of the installed
# ones for the levels it holds -- the sanitizer build (`make sanitize`) is loaded this way.
KERNEL_DIR_ENV = "CAIRN_KERNEL_DIR"


def cpu_flags() -> frozenset[str]:
    from cairn import _cpu

    return frozenset(_cpu.features())


def runnable(flags: frozenset[str]) -> list[str]:
    """The levels this CPU runs, best first."""
    return [isa for isa, need in LEVELS.items() if need <= flags]


def choose(flags: frozenset[str], built: list[str], forced: str | None = None) -> str:
    if forced:
        if forced not in LEVELS:
            raise ImportError(f"CAIRN_ISA={forced!r}: not a kernel level; the levels are {', '.join(LEVELS)}")
        if forced not in built:
            raise ImportError(f"CAIRN_ISA={forced!r}: this build has no such kernel (built: {', '.join(built)}; "
                              "`make serve` builds only this CPU's level, `make install` or `pip install .` every one)")
        if forced not in runnable(flags):
            raise ImportError(f"CAIRN_ISA={forced!r}: this CPU (or its OS) lacks "
                              f"{', '.join(sorted(LEVELS[forced] - flags))}")
        return forced
    for isa in runnable(flags):
        if isa in built:
            return isa
    raise ImportError(f"no kernel build this CPU can run (built: {', '.join(built) or 'none'}; "
                      "reinstall to build one for it)")


def override_module(isa: str, kernel_dir: str | None) -> Path | None:
    """The module file for `isa` in kernel_dir (CAIRN_KERNEL_DIR), if it holds one."""
    if not kernel_dir:
        return None
    found = sorted(Path(kernel_dir).glob(f"_kernel_{isa}.*.so"))
    return found[0] if found else None


def built_levels() -> list[str]:
    kernel_dir = os.environ.get(KERNEL_DIR_ENV)
    return [isa for isa in LEVELS
            if override_module(isa, kernel_dir) or importlib.util.find_spec(f"cairn._kernel_{isa}") is not None]


# Builds whose numbers are the same bits (docs/architecture.md): the levels with fused multiply-adds.
# x86-64-v2 (and an x86 build for the compiler's default target) rounds a multiply and an add apart.
FMA_LEVELS = frozenset({"v3", "v4"})
FMA_MACHINES = frozenset({"aarch64", "arm64"})   # where the default target ("base") has FMA (NEON)


def numeric_class(isa: str, machine: str | None = None) -> str:
    """The rounding class of a kernel build: "fma" (x86-64-v3, -v4, aarch64) or "nofma" (x86-64-v2,
    an x86 base build); a base build on another machine is a class of its own ("base-<machine>").
    Checkpoints are keyed by it: a state or page of one class is never restored by another."""
    if isa in FMA_LEVELS:
        return "fma"
    if isa != "base":
        return "nofma"
    import platform    # only here: the other answers need no probe of the machine
    m = (machine or platform.machine()).lower()
    return "fma" if m in FMA_MACHINES else "nofma" if m in ("x86_64", "amd64", "i686", "i386") else f"base-{m}"
