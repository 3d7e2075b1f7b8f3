"""Write the GGUF test fixtures (tests/fixtures/gguf/): tiny DeepSeek-V4 models made by `cairn make-model`
(preset gguf-tiny, inside llama.cpp's loader limits) and converted by llama.cpp's own converter, run
through the shared llama-peer shim (../shared/tools/llama-peer/convert_hf_v4.py: its run-time patches for
HF-written directories; no llama.cpp file is edited, nothing is compiled).

    .venv/bin/python scripts/make_gguf_fixtures.py [--llama-cpp SRC] [--llama-bin BIN] [--only float|quant]
                                                   [--out tests/fixtures/gguf]

SRC is a llama.cpp source tree; by default the one the llama-cpp-python sdist vendors, downloaded from
PyPI and unpacked into ~/.cache/llama-peer/ (build.sh's download step, without its build). Needs torch,
transformers and pyyaml (the oracle and bench extras). BIN holds llama.cpp's `llama-quantize` and
`llama-imatrix` for the quantized fixtures (default SRC/build/bin, as ../shared/tools/llama-peer/build.sh
builds them). --only: write one of the two sets (the other's files and MANIFEST entries are kept).

Fixtures (the model directory each came from is `make_model("gguf-tiny", 0, dtype=...)`, regenerated
by the tests; MANIFEST.json lists the inputs, SHA256SUMS the bytes):
  gguf-tiny-f32.gguf                       F32 source, --outtype f32: every tensor F32
  gguf-tiny-bf16.gguf                      BF16 source: matrices BF16, vectors/norms/experts F32 (the converter's choice)
  gguf-tiny-f16.gguf                       F16 source, --outtype f16: matrices F16, vectors/norms/experts F32
  gguf-tiny-split-0000K-of-00003.gguf      F32, split by the converter (--split-max-tensors 40)

Quantized fixtures (issue 23): `make_model("gguf-quant", 0)` (every matrix's rows a whole number of 256-value
blocks), converted with --outtype f32, then `llama-quantize` into one file per mix; MANIFEST.json records
each file's tensor types (from gguf.GGUFReader), per tensor and counted:
  gguf-quant-q8_0.gguf        Q8_0
  gguf-quant-q4_k_m.gguf      Q4_K_M  (Q4_K, Q6_K; Q5_0 where a row is 128 wide)
  gguf-quant-q5_k_m.gguf      Q5_K_M  (Q5_K, Q6_K; Q5_1 where a row is 128 wide)
  gguf-quant-q6_k.gguf        Q6_K    (Q6_K; Q8_0 where a row is 128 wide)
  gguf-quant-q2_k.gguf        Q2_K    (Q2_K, Q3_K, Q6_K; Q4_0 where a row is 128 wide)
  gguf-quant-q3_k_m.gguf      Q3_K_M  (Q3_K, Q4_K, Q6_K; Q4_0 where a row is 128 wide)
  gguf-quant-q4_0.gguf        Q4_0    (Q4_0, Q6_K; the routed experts' down projections Q4_1)
  gguf-quant-iq4_xs.gguf      IQ4_XS  (IQ4_XS, Q6_K; IQ4_NL where a row is 128 wide)
  gguf-quant-iq2_xxs.gguf     IQ2_XXS (IQ2_XXS, Q2_K, Q5_K), with an importance matrix computed by
                              llama-imatrix on text make_model synthesises (its tokenizer's corpus);
                              the same for IQ2_XS, IQ2_M (IQ2_S), IQ3_XXS, IQ3_S, IQ1_S, IQ1_M
  gguf-quant-mxfp4_moe.gguf   MXFP4_MOE (routed experts MXFP4, other matrices Q8_0)
Vectors and norms stay F32 (llama-quantize's rule), the router and tid2eid are never quantized. The
indexer's position bias is 128 wide, no 256-value block fits its rows, and llama.cpp falls back to a
32-value type there (Q5_0, Q5_1, Q8_0, Q4_0, IQ4_NL): the fixtures keep those fallbacks, as the files users
download have them. The grid types (IQ1-IQ3) need an importance matrix they cannot have on the position
biases and the head's hyper-connection (no matrix products): there the type is forced (--tensor-type,
below). A file holding any type outside ggml_types.SUPPORTED + F32/F16/BF16 stops the script.
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
QUANT_PRESET = "gguf-quant"
_IMATRIX_LESS = ["--tensor-type", "compressor_ape=q8_0", "--tensor-type", "output_hc_fn=q2_K"]
QUANT_FIXTURES = {
    # file stem -> (llama-quantize type, extra arguments, with the importance matrix)
    "gguf-quant-q8_0": ("Q8_0", [], False),
    "gguf-quant-q4_k_m": ("Q4_K_M", [], False),
    "gguf-quant-q5_k_m": ("Q5_K_M", [], False),
    "gguf-quant-q6_k": ("Q6_K", [], False),
    "gguf-quant-q2_k": ("Q2_K", [], False),
    "gguf-quant-q3_k_m": ("Q3_K_M", [], False),
    "gguf-quant-q4_0": ("Q4_0", ["--tensor-type", "ffn_down_exps=q4_1"], False),
    "gguf-quant-iq4_xs": ("IQ4_XS", [], False),
    # The grid types want importance data for every tensor of their type; llama-imatrix sees matrix
    # products only: both position biases to Q8_0, the head's hyper-connection matrix to Q2_K.
    # (llama.cpp's IQ2_S mix is mostly IQ2_XS; its IQ2_M holds IQ2_S)
    **{f"gguf-quant-{t.lower()}": (t, _IMATRIX_LESS, True)
       for t in ("IQ2_XXS", "IQ2_XS", "IQ2_M", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M")},
    "gguf-quant-mxfp4_moe": ("MXFP4_MOE", [], False),
}
# the importance matrix: llama-imatrix over this many words of make_model's synthetic corpus, in chunks
IMATRIX_WORDS, IMATRIX_CTX, IMATRIX_CHUNKS = 4000, 128, 8


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


def llama_bin(given: str | None, src: Path) -> Path:
    bin_dir = Path(given) if given else src / "build" / "bin"
    missing = [t for t in ("llama-quantize", "llama-imatrix") if not (bin_dir / t).is_file()]
    if missing:
        raise SystemExit(f"{bin_dir}: no {', '.join(missing)}; build them with "
                         "../shared/tools/llama-peer/build.sh, or name their directory with --llama-bin")
    return bin_dir


def _run(cmd: list[str], what: str, cwd: Path | None = None) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", cwd=cwd)   # llama.cpp logs token bytes
    if r.returncode != 0:
        raise SystemExit(f"{what} failed:\n{(r.stdout + r.stderr)[-3000:]}")


def _convert(src: Path, hf: Path, target: Path, outtype: str, split: int, stem: str) -> None:
    _run([sys.executable, __file__, "--convert-one", str(src), str(hf), str(target), outtype, str(split)],
         f"converting {stem}")


def tensor_types(path: Path) -> dict[str, str]:
    """GGUF tensor name -> GGML type name, as gguf.GGUFReader reads the file."""
    from gguf import GGUFReader

    return {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}


def write_float_fixtures(src: Path, out: Path, tmp: Path, manifest: dict) -> None:
    from cairn.daemon.modelgen.make_model import make_model

    for stem, (dtype, outtype, split) in FIXTURES.items():
        hf = tmp / dtype / PRESET   # the directory name becomes general.name: keep it fixed
        if not hf.exists():
            make_model(PRESET, SEED, hf, dtype=dtype)
        _convert(src, hf, out / f"{stem}.gguf", outtype, split, stem)
        manifest[stem] = {"preset": PRESET, "seed": SEED, "dtype": dtype, "outtype": outtype,
                          "split_max_tensors": split}


def write_quant_fixtures(src: Path, bin_dir: Path, out: Path, tmp: Path, manifest: dict) -> None:
    from cairn.daemon.modelgen.make_model import _corpus, make_model
    from cairn.daemon.weights import ggml_types

    hf = tmp / "quant" / QUANT_PRESET
    make_model(QUANT_PRESET, SEED, hf)
    work = tmp / "quant"   # llama-quantize records the importance matrix by the path it was given:
    f32 = work / f"{QUANT_PRESET}-f32.gguf"   # run in this directory, with relative names
    _convert(src, hf, f32, "f32", 0, f32.stem)
    text, imatrix = f"{QUANT_PRESET}-imatrix.txt", f"{QUANT_PRESET}-imatrix.gguf"
    (work / text).write_text("\n".join(_corpus(IMATRIX_WORDS)) + "\n")
    # one thread: the sums are then in one order (the file is the same whatever the machine's cores)
    _run([str(bin_dir / "llama-imatrix"), "-m", f32.name, "-f", text, "-o", imatrix, "-c", str(IMATRIX_CTX),
          "--chunks", str(IMATRIX_CHUNKS), "-t", "1"], "llama-imatrix", cwd=work)
    imatrix_sha = hashlib.sha256((work / imatrix).read_bytes()).hexdigest()
    allowed = set(ggml_types.SUPPORTED) | {"F32", "F16", "BF16", "I32"}
    for stem, (qtype, extra, use_imatrix) in QUANT_FIXTURES.items():
        target = out / f"{stem}.gguf"
        args = [*extra, *(["--imatrix", imatrix] if use_imatrix else [])]
        _run([str(bin_dir / "llama-quantize"), *args, f32.name, str(target), qtype, "1"],
             f"llama-quantize {qtype}", cwd=work)
        types = tensor_types(target)
        bad = sorted({t for t in types.values() if t not in allowed})
        if bad:
            raise SystemExit(f"{target.name}: llama-quantize gave tensor types {', '.join(bad)} "
                             f"({', '.join(n for n, t in types.items() if t in bad)}); force them into one of "
                             f"{', '.join(sorted(allowed))} with --tensor-type in QUANT_FIXTURES")
        counts: dict[str, int] = {}
        for t in types.values():
            counts[t] = counts.get(t, 0) + 1
        entry = {"preset": QUANT_PRESET, "seed": SEED, "dtype": "float32", "outtype": "f32",
                 "llama_quantize": {"type": qtype, "args": args}, "tensor_types": types, "type_counts": counts}
        if use_imatrix:
            entry["imatrix"] = {"text": f"make_model._corpus({IMATRIX_WORDS})", "ctx": IMATRIX_CTX,
                                "chunks": IMATRIX_CHUNKS, "sha256": imatrix_sha}
        manifest[stem] = entry


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-cpp", help="llama.cpp source tree (default: the PyPI sdist's, downloaded once)")
    ap.add_argument("--llama-bin", help="directory of llama-quantize and llama-imatrix (default: SRC/build/bin)")
    ap.add_argument("--only", choices=("float", "quant"), help="write only this set of fixtures")
    ap.add_argument("--out", default=str(REPO / "tests" / "fixtures" / "gguf"))
    ap.add_argument("--convert-one", nargs=5, metavar=("SRC", "HF", "OUT", "OUTTYPE", "SPLIT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.convert_one:
        s, hf, out, outtype, split = a.convert_one
        convert_one(s, hf, out, outtype, int(split))
        return

    src = llama_cpp_source(a.llama_cpp)
    sets = [a.only] if a.only else ["float", "quant"]
    bin_dir = llama_bin(a.llama_bin, src) if "quant" in sets else None
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    old = out / "MANIFEST.json"
    manifest = json.loads(old.read_text()) if old.exists() else {}
    manifest.update({"llama_cpp": f"llama-cpp-python {SDIST_VERSION} sdist (vendor/llama.cpp)",
                     "converter": "../shared/tools/llama-peer/convert_hf_v4.py patches + convert_hf_to_gguf.main()"})
    fixtures = manifest.setdefault("fixtures", {})
    prefixes = {"float": f"{PRESET}-", "quant": f"{QUANT_PRESET}-"}
    for s in sets:   # a set is written whole: its old files and entries go first (renamed ones too)
        for stem in [k for k in fixtures if k.startswith(prefixes[s])]:
            fixtures.pop(stem)
        for f in out.glob(f"{prefixes[s]}*.gguf"):
            f.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        if "float" in sets:
            write_float_fixtures(src, out, Path(tmp), fixtures)
        if "quant" in sets:
            write_quant_fixtures(src, bin_dir, out, Path(tmp), fixtures)
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    sums = []
    for f in sorted(out.glob("*.gguf")):
        sums.append(f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.name}")
        print(f"{f.stat().st_size:>9}  {f.name}")
    (out / "SHA256SUMS").write_text("\n".join(sums) + "\n")


if __name__ == "__main__":
    main()
