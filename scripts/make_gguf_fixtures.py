"""Write the GGUF test fixtures (tests/fixtures/gguf/): tiny DeepSeek-V4 models made by `cairn make-model`
(preset gguf-tiny, inside llama.cpp's loader limits) and converted by llama.cpp's own converter, run
through the shared llama-peer shim (../shared/tools/llama-peer/convert_hf_v4.py: its run-time patches for
HF-written directories; no llama.cpp file is edited, nothing is compiled).

    .venv/bin/python scripts/make_gguf_fixtures.py [--llama-cpp SRC] [--out tests/fixtures/gguf]

SRC is a llama.cpp source tree; by default the one the llama-cpp-python sdist vendors, downloaded from
PyPI and unpacked into ~/.cache/llama-peer/ (build.sh's download step, without its build). Needs torch,
transformers and pyyaml (the oracle and bench extras).

Fixtures (the model directory each came from is `make_model("gguf-tiny", 0, dtype=...)`, regenerated
by the tests; MANIFEST.json lists the inputs, SHA256SUMS the bytes):
  gguf-tiny-f32.gguf                       F32 source, --outtype f32: every tensor F32
  gguf-tiny-bf16.gguf                      BF16 source: matrices BF16, vectors/norms/experts F32 (the converter's choice)
  gguf-tiny-f16.gguf                       F16 source, --outtype f16: matrices F16, vectors/norms/experts F32
  gguf-tiny-split-0000K-of-00003.gguf      F32, split by the converter (--split-max-tensors 40)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHIM = REPO.parent / "shared" / "tools" / "llama-peer" / "convert_hf_v4.py"
SDIST_VERSION = "0.3.36"   # as build.sh: vendors ggml-org/llama.cpp at 0c1e5709
PRESET, SEED = "gguf-tiny", 0
FIXTURES = {
    # file stem -> (make_model dtype, converter --outtype, --split-max-tensors)
    "gguf-tiny-f32": ("float32", "f32", 0),
    "gguf-tiny-bf16": ("bfloat16", "f32", 0),   # the converter keeps a BF16 source's matrices BF16
    "gguf-tiny-f16": ("float16", "f16", 0),
    "gguf-tiny-split": ("float32", "f32", 40),
}


def llama_cpp_source(given: str | None) -> Path:
    if given:
        return Path(given)
    dest = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "llama-peer"
    src = dest / f"llama_cpp_python-{SDIST_VERSION}" / "vendor" / "llama.cpp"
    if not src.is_dir():
        dest.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary",
                        "llama-cpp-python", "-d", str(dest), f"llama-cpp-python=={SDIST_VERSION}"], check=True)
        shutil.unpack_archive(dest / f"llama_cpp_python-{SDIST_VERSION}.tar.gz", dest)
    return src


def convert_one(src: str, hf_dir: str, out: str, outtype: str, split: int) -> None:
    """In a child process: the shim's patches, then llama.cpp's converter main() with our arguments."""
    sys.argv = [str(SHIM), src, hf_dir, out]
    runpy.run_path(str(SHIM), run_name="llama_peer_shim")   # applies the patches; does not convert
    import convert_hf_to_gguf as conv

    sys.argv = ["convert_hf_to_gguf.py", hf_dir, "--outtype", outtype, "--outfile", out]
    if split:
        sys.argv += ["--split-max-tensors", str(split)]
    conv.main()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-cpp", help="llama.cpp source tree (default: the PyPI sdist's, downloaded once)")
    ap.add_argument("--out", default=str(REPO / "tests" / "fixtures" / "gguf"))
    ap.add_argument("--convert-one", nargs=5, metavar=("SRC", "HF", "OUT", "OUTTYPE", "SPLIT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.convert_one:
        s, hf, out, outtype, split = a.convert_one
        convert_one(s, hf, out, outtype, int(split))
        return

    from cairn.daemon.modelgen.make_model import make_model

    src = llama_cpp_source(a.llama_cpp)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.gguf"):
        old.unlink()
    manifest = {"llama_cpp": f"llama-cpp-python {SDIST_VERSION} sdist (vendor/llama.cpp)",
                "converter": "../shared/tools/llama-peer/convert_hf_v4.py patches + convert_hf_to_gguf.main()",
                "fixtures": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for stem, (dtype, outtype, split) in FIXTURES.items():
            hf = Path(tmp) / dtype / PRESET   # the directory name becomes general.name: keep it fixed
            if not hf.exists():
                make_model(PRESET, SEED, hf, dtype=dtype)
            target = out / f"{stem}.gguf"
            r = subprocess.run([sys.executable, __file__, "--convert-one", str(src), str(hf), str(target),
                                outtype, str(split)], capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"converting {stem} failed:\n{r.stderr[-3000:]}")
            manifest["fixtures"][stem] = {"preset": PRESET, "seed": SEED, "dtype": dtype, "outtype": outtype,
                                          "split_max_tensors": split}
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    sums = []
    for f in sorted(out.glob("*.gguf")):
        sums.append(f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.name}")
        print(f"{f.stat().st_size:>9}  {f.name}")
    (out / "SHA256SUMS").write_text("\n".join(sums) + "\n")


if __name__ == "__main__":
    main()
