"""llama.cpp's logits on the quantized GGUF fixtures against HF on their dequantized directories (issue 23,
a report column, not a test).

    .venv/bin/python bench/gguf_llama_logits.py [--llama-cpp SRC] [--tokens 256] [--threads 2] [FILE.gguf ...]

For each file (default: tests/fixtures/gguf/gguf-quant-*.gguf): scripts/dequantize_gguf.py writes the F32
directory it stands for; HF's DeepseekV4ForCausalLM runs a fixed id sequence on it (full forward, no
cache); llama.cpp runs the same ids on the quantized file (the shared llama-peer `dump_logits.cpp`,
built here once against SRC's libllama, f32 KV cache, one batch). Printed per file: max |Δlogit| of
  llama.cpp on the quantized file        (its quantized matmuls: activations are requantized too),
                                         with the median over positions of each position's max
  llama.cpp on the dequantized weights   (an F32 GGUF of the directory, by the llama-peer converter)
  cairn's fp32 path on the directory     (the oracle's counterpart: the quantized path must equal it)
each against HF on the directory, and how many positions' argmax agree with HF's.
SRC: a llama.cpp tree built by ../shared/tools/llama-peer/build.sh (default: its cache folder).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "scripts"))

import llama_peer  # noqa: E402
from dequantize_gguf import dequantized_model_dir  # noqa: E402

FIX = REPO / "tests" / "fixtures" / "gguf"
DEFAULT_SRC = (Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "llama-peer"
               / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp")


def dump_logits_exe(tools: Path, src: Path) -> Path:
    """dump_logits built against src's libllama (the build line of its header), once, in our own cache
    folder (the shared build's is left as build.sh made it)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cairn-bench"
    cache.mkdir(parents=True, exist_ok=True)
    exe = cache / f"dump_logits-{hashlib.sha256(str(src.resolve()).encode()).hexdigest()[:12]}"
    cpp = tools / "dump_logits.cpp"
    if exe.exists() and exe.stat().st_mtime >= cpp.stat().st_mtime:
        return exe
    lib = src / "build" / "bin"
    cmd = ["g++", "-O2", "-std=c++17", str(cpp), "-I", str(src / "include"), "-I", str(src / "ggml" / "include"),
           "-L", str(lib), "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{lib}", "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"building dump_logits failed:\n{r.stderr[-2000:]}")
    return exe


def llama_logits(exe: Path, gguf: Path, ids: np.ndarray, threads: int, work: Path) -> np.ndarray:
    ids_file, out = work / "ids.txt", work / "logits.bin"
    ids_file.write_text(" ".join(str(int(i)) for i in ids) + "\n")
    r = subprocess.run([str(exe), str(gguf), str(ids_file), str(out), str(threads), str(len(ids)), "f32"],
                       capture_output=True, text=True, errors="replace")
    if r.returncode != 0:
        raise SystemExit(f"dump_logits on {gguf.name} failed:\n{r.stderr[-2000:]}")
    return np.fromfile(out, np.float32).reshape(len(ids), -1)


def hf_logits(model_dir: Path, ids: np.ndarray) -> np.ndarray:
    import torch
    from transformers import DeepseekV4ForCausalLM

    hf = DeepseekV4ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(input_ids=torch.tensor(ids[None].astype(np.int64)), use_cache=False).logits[0].numpy()


def cairn_logits(model_dir: Path, ids: np.ndarray, threads: int) -> np.ndarray:
    import cairn._kernel as K
    from cairn.daemon.weights.model_dir import load_model

    _, out = K.prefill(K.State(load_model(model_dir, threads=threads)), ids.astype(np.int32), chunk=64,
                       all_logits=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="GGUF files (default: the gguf-quant-* fixtures)")
    ap.add_argument("--llama-cpp", default=str(DEFAULT_SRC), help="llama.cpp tree with build/bin (build.sh's)")
    ap.add_argument("--peer-tools", help="the llama-peer tools (default ../shared/tools/llama-peer)")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    tools = llama_peer.tools_dir(a.peer_tools)
    src = Path(a.llama_cpp)
    exe = dump_logits_exe(tools, src)
    files = [Path(f) for f in a.files] or sorted(FIX.glob("gguf-quant-*.gguf"))
    print(f"{a.tokens} ids (seed {a.seed}), {a.threads} threads; max |Δlogit| against HF on the dequantized "
          "directory; argmax agreement with HF")
    print(f"{'file':<28}{'llama.cpp quant':>16}{'(median)':>10}{'llama.cpp f32':>15}{'cairn fp32':>12}"
          "   argmax (quant / f32 / cairn)")
    with tempfile.TemporaryDirectory() as tmp:
        for f in files:
            work = Path(tmp) / f.stem
            deq = dequantized_model_dir(f, work / f.stem)
            from cairn.daemon.weights.model_dir import open_model_dir

            vocab = open_model_dir(deq).config["vocab_size"]
            ids = np.random.default_rng(a.seed).integers(0, vocab, a.tokens)
            ref = hf_logits(deq, ids)
            f32 = llama_peer.ensure_gguf(tools, src, str(deq), str(work / "deq.f32.gguf"))
            cols = [llama_logits(exe, f, ids, a.threads, work), llama_logits(exe, f32, ids, a.threads, work),
                    cairn_logits(deq, ids, a.threads)]
            d = [float(np.abs(c - ref).max()) for c in cols]
            # the median position's max |Δ|: the broad error, apart from the few positions where a
            # near-tied top-1 expert or indexer top-k choice flips
            med = float(np.median(np.abs(cols[0] - ref).max(axis=1)))
            agree = [int((c.argmax(1) == ref.argmax(1)).sum()) for c in cols]
            print(f"{f.name:<28}{d[0]:>16.4g}{med:>10.3g}{d[1]:>15.4g}{d[2]:>12.3g}   "
                  f"{agree[0]}/{agree[1]}/{agree[2]} of {a.tokens}", flush=True)


if __name__ == "__main__":
    main()
