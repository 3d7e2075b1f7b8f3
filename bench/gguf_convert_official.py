"""Convert a DeepSeek-V4 directory in the official quantized layout (FP8 e4m3 linears with 128x128 ue8m0
scales, FP4 e2m1 routed experts with per-32 ue8m0 scales) to GGUF with llama.cpp's own converter: the
experts repacked to MXFP4 as stored, the FP8 linears dequantized and written Q8_0 (the stock converter's
rule), the rest at --outtype (issue 23 benchmark input, not a test).

    python bench/gguf_convert_official.py LLAMA_CPP_SRC MODEL_DIR OUT.gguf [--outtype bf16]

The shared llama-peer shim (../shared/tools/llama-peer/convert_hf_v4.py) is applied for its config-key,
tensor-name and pre-tokenizer patches; its two patches for HF-written F32 directories (experts stacked
as F32, file type forced ALL_F32) are undone, since this directory carries the official FP4 experts the
stock converter is written for. Run with a python that has torch, transformers, safetensors, pyyaml.
"""
from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

SHIM = Path(__file__).resolve().parents[2] / "shared" / "tools" / "llama-peer" / "convert_hf_v4.py"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", help="llama.cpp source tree (has convert_hf_to_gguf.py and conversion/)")
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--outtype", default="bf16", help="type of tensors the converter does not force (default bf16)")
    ap.add_argument("--shim", default=str(SHIM))
    a = ap.parse_args()
    sys.path.insert(0, str(Path(a.src) / "gguf-py"))
    sys.path.insert(0, a.src)
    from conversion import deepseek

    v4 = deepseek.DeepseekV4Model
    stock = {"_write_mxfp4_expert_tensor": v4._write_mxfp4_expert_tensor, "prepare_tensors": v4.prepare_tensors}
    sys.argv = [a.shim, a.src, a.model_dir, a.out]
    runpy.run_path(a.shim, run_name="llama_peer_shim")   # applies the patches; does not convert
    for name, fn in stock.items():
        setattr(v4, name, fn)
    import convert_hf_to_gguf as conv

    sys.argv = ["convert_hf_to_gguf.py", a.model_dir, "--outtype", a.outtype, "--outfile", a.out]
    conv.main()


if __name__ == "__main__":
    main()
