"""cairn's C++ kernel, as built for this CPU.

One build holds the kernel compiled for each x86-64 level (native/CMakeLists.txt): `_kernel_v4`
(AVX-512), `_kernel_v3` (AVX2, FMA, F16C), `_kernel_v2` (SSE4.2), or `_kernel_base` (the compiler's
default target: NEON on aarch64). This module becomes the best of them this CPU runs; `ISA` names
it. CAIRN_ISA=v3 (say) picks one by hand: a level the CPU lacks, or one not built, is an error.
"""

from __future__ import annotations

import importlib
import os
import sys

# what each level needs from /proc/cpuinfo's flags (the x86-64 psABI levels, as GCC's -march=x86-64-vN)
LEVELS: dict[str, frozenset[str]] = {
    "v4": frozenset({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx2", "fma", "f16c", "bmi2"}),
    "v3": frozenset({"avx2", "fma", "f16c", "bmi1", "bmi2", "movbe"}),
    "v2": frozenset({"sse4_2", "ssse3", "popcnt"}),
    "base": frozenset(),
}


def cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def runnable(flags: frozenset[str]) -> list[str]:
    """The levels this CPU runs, best first."""
    return [isa for isa, need in LEVELS.items() if need <= flags]


def choose(flags: frozenset[str], built: list[str], forced: str | None = None) -> str:
    if forced:
        if forced not in LEVELS:
            raise ImportError(f"CAIRN_ISA={forced!r}: not a kernel level; the levels are {', '.join(LEVELS)}")
        if forced not in built:
            raise ImportError(f"CAIRN_ISA={forced!r}: this build has no such kernel (built: {', '.join(built)})")
        if forced not in runnable(flags):
            raise ImportError(f"CAIRN_ISA={forced!r}: this CPU lacks {', '.join(sorted(LEVELS[forced] - flags))}")
        return forced
    for isa in runnable(flags):
        if isa in built:
            return isa
    raise ImportError(f"no kernel build this CPU can run (built: {', '.join(built) or 'none'}; "
                      "reinstall to build one for it)")


def built_levels() -> list[str]:
    import importlib.util

    return [isa for isa in LEVELS if importlib.util.find_spec(f"cairn._kernel_{isa}") is not None]


_isa = choose(cpu_flags(), built_levels(), os.environ.get("CAIRN_ISA") or None)
sys.modules[__name__] = importlib.import_module(f"cairn._kernel_{_isa}")
