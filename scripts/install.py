"""Install cairn into the venv this runs in, saying what it builds while it builds (the Makefile's
`make serve` and `make install`).

    python scripts/install.py --host-level          # make serve: the serving set, this CPU's level
    python scripts/install.py --extras test,oracle,gateway   # make install / make test: every level

A first build compiles the kernel once per x86-64 level (native/CMakeLists.txt), minutes each on
2 cores, and pip shows nothing meanwhile. So pip runs verbose into build/install.log, and what a
person needs from it is printed: the phase, which level, files compiled out of how many, elapsed
time. `--host-level` builds only the level this CPU runs best (cairn/isa.py, asked of native/src/cpu.cpp
compiled on its own: the installed `cairn._cpu` does not exist yet); the other levels come with
`make test` or a package build (`pip install .`), which still builds every level. On failure the
log's tail is printed and the exit status is pip's.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import re
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOG = ROOT / "build" / "install.log"
# one level's kernel, measured on 2 cores of a Zen 3 (docs/benchmarks.md is not the place: README)
MINUTES_PER_LEVEL = 2
COMPILE = re.compile(r"^\[(\d+)/(\d+)\] Building CXX object CMakeFiles/(\w+)\.dir/")
LEVEL_OF = re.compile(r"^_kernel_(\w+)$")


def host_level() -> str:
    """The best kernel level this CPU runs: cpu.cpp built as a throwaway module, isa.py's rule."""
    import pybind11

    ext = sysconfig.get_config_var("EXT_SUFFIX")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"_cpu{ext}"
        cmd = ["c++", "-O0", "-std=c++17", "-shared", "-fPIC", f"-I{pybind11.get_include()}",
               f"-I{sysconfig.get_paths()['include']}", str(ROOT / "native/src/cpu.cpp"), "-o", str(out)]
        subprocess.run(cmd, check=True)
        cpu = _load("_cpu", out)
        isa = _load("cairn_isa_probe", ROOT / "native/cairn/isa.py")
        return isa.runnable(frozenset(cpu.features()))[0]


def _load(name: str, path: Path):
    if path.suffix == ".py":
        spec = importlib.util.spec_from_file_location(name, path)
    else:
        spec = importlib.util.spec_from_file_location(
            name, path, loader=importlib.machinery.ExtensionFileLoader(name, str(path)))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Progress:
    """Reads pip's verbose output line by line; prints a line per phase and the compile's progress
    (at most one line per 10 % or 20 s)."""

    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self.t0 = clock()
        self.phase = ""
        self.last = (-1, self.t0)    # the tenth and the time of the last progress line

    def say(self, text: str) -> None:
        print(f"  [{self.clock() - self.t0:4.0f} s] {text}", flush=True)

    def feed(self, line: str) -> None:
        if line.startswith("Collecting ") and self.phase == "":
            self.phase = "fetch"
            self.say("fetching the Python packages")
        elif self.phase != "build" and ("Building editable for cairn" in line or "Building wheel for cairn" in line):
            self.phase = "build"
            self.say("compiling the kernel (native/)")
        elif line.startswith("Successfully installed"):
            self.say("installed: " + line.removeprefix("Successfully installed ").strip()[:200])
        m = COMPILE.match(line.strip())     # pip indents its build backend's output
        if m:
            done, total, target = int(m.group(1)), int(m.group(2)), m.group(3)
            now = self.clock()
            tenth = 10 * done // total
            if tenth > self.last[0] or now - self.last[1] >= 20:
                lvl = LEVEL_OF.match(target)
                what = f"kernel x86-64-{lvl.group(1)}" if lvl and lvl.group(1) != "base" else target.lstrip("_")
                self.say(f"{done}/{total} files compiled (now: {what})")
                self.last = (tenth, now)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host-level", action="store_true", help="build only this CPU's best kernel level")
    ap.add_argument("--extras", default="", help="comma-separated extras of pyproject.toml (test,oracle,gateway)")
    args = ap.parse_args(argv)

    progress = Progress()
    target = f".[{args.extras}]" if args.extras else "."
    cmd = [sys.executable, "-m", "pip", "install", "-v", "--no-build-isolation", "-e", target]
    if args.host_level:
        print("cairn: asking this CPU which kernel level it runs (native/src/cpu.cpp)", flush=True)
        level = host_level()
        cmd.insert(4, f"--config-settings=cmake.define.CAIRN_ISAS={level}")
        print(f"cairn: installing the serving set and the kernel for {_name(level)}, this CPU's level: about "
              f"{MINUTES_PER_LEVEL + 1} minutes the first time on 2 cores, seconds after that. The other "
              "levels are built by `make test` or `pip install .`.", flush=True)
    else:
        print(f"cairn: installing {target} with the kernel for every x86-64 level (v4, v3, v2): about "
              f"{3 * MINUTES_PER_LEVEL + 1} minutes the first time on 2 cores, seconds after an edit.", flush=True)
    print(f"cairn: pip's full output goes to {LOG.relative_to(ROOT)}", flush=True)
    LOG.parent.mkdir(exist_ok=True)
    tail: list[str] = []
    with open(LOG, "w", buffering=1) as log, subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                   text=True, bufsize=1) as proc:
        for line in proc.stdout:
            log.write(line)
            progress.feed(line)
            tail = (tail + [line])[-60:]
    if proc.returncode != 0:
        sys.stdout.writelines(tail)
        print(f"cairn: pip failed (exit {proc.returncode}); the whole output is in {LOG}", file=sys.stderr)
        return proc.returncode
    progress.say("done")
    return 0


def _name(level: str) -> str:
    return "the compiler's default target" if level == "base" else f"x86-64-{level}"


if __name__ == "__main__":
    sys.exit(main())
