"""cairn's C++ kernel, as built for this CPU.

One build holds the kernel compiled for each x86-64 level (native/CMakeLists.txt): `_kernel_v4`
(AVX-512), `_kernel_v3` (AVX2, FMA, F16C), `_kernel_v2` (SSE4.2), or `_kernel_base` (the compiler's
default target: NEON on aarch64). This module becomes the best of them this CPU runs (cairn/isa.py);
`ISA` names it. CAIRN_ISA=v3 (say) picks one by hand: a level the CPU lacks, or one not built, is an
error. CAIRN_KERNEL_DIR=dir loads a level's module from dir when it holds one (the sanitizer build).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys

from cairn.isa import KERNEL_DIR_ENV, built_levels, choose, cpu_flags, override_module


def _load(isa: str):
    name = f"cairn._kernel_{isa}"
    kernel_dir = os.environ.get(KERNEL_DIR_ENV)
    if kernel_dir and not os.path.isdir(kernel_dir):
        raise ImportError(f"{KERNEL_DIR_ENV}={kernel_dir!r}: not a directory (it should hold _kernel_<level> modules)")
    path = override_module(isa, kernel_dir)
    if path is None:
        return importlib.import_module(name)
    spec = importlib.util.spec_from_file_location(name, path, loader=importlib.machinery.ExtensionFileLoader(name, str(path)))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_isa = choose(cpu_flags(), built_levels(), os.environ.get("CAIRN_ISA") or None)
sys.modules[__name__] = _load(_isa)
