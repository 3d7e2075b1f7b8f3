"""Which build of the kernel this CPU runs (cairn/_kernel.py loads it; native/CMakeLists.txt builds one
per level): plain policy over /proc/cpuinfo's flags, so it is testable with any flags."""

from __future__ import annotations

import importlib.util

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
    return [isa for isa in LEVELS if importlib.util.find_spec(f"cairn._kernel_{isa}") is not None]


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
