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

from cairn.isa import built_levels, choose, cpu_flags

_isa = choose(cpu_flags(), built_levels(), os.environ.get("CAIRN_ISA") or None)
sys.modules[__name__] = importlib.import_module(f"cairn._kernel_{_isa}")
