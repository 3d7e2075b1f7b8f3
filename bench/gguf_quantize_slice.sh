#!/usr/bin/env bash
# The GGUF files of issue 23 item 7 (a benchmark input, not a test): the V4-Flash slice (layers 2-3: CSA
# and HCA) converted with llama.cpp's own converter (MXFP4 experts as stored, FP8 linears -> Q8_0), then
# requantized with llama-quantize to antirez's two mixes:
#   q4   Q4_K routed experts (gate, up, down)
#   q2   IQ2_XXS gate/up experts, Q2_K down experts (IQ2_XXS needs an importance matrix: llama-imatrix on
#        the MXFP4 file over the repository's docs/*.md, a few thousand tokens)
# Every other tensor keeps its source type: --pure (no k-quant mixture rules) with base type Q8_0, so the
# Q8_0 linears are copied; the BF16 compressors/indexer projection/embedding/head and the F32 2-D tensors
# (compressor APE, hyper-connection fns) are named back to their own types; the router (ffn_gate_inp)
# and the hash table are never quantized by llama-quantize.
#
# usage: bench/gguf_quantize_slice.sh [OUT_DIR]      (default /work/gguf23; needs ~30 GB there)
#   LLAMA_SRC=.../vendor/llama.cpp (`../shared/tools/llama-peer/build.sh /work/llama-peer` builds it and
#     prints it; binaries in build/bin)
#   PY_CONVERT=python for the converter, as made here: python3 -m venv /work/venv-convert &&
#     /work/venv-convert/bin/pip install torch==2.13.0 transformers==5.24.0 safetensors numpy pyyaml sentencepiece protobuf
# then (as run for docs/benchmarks.md; the first command twice):
#   .venv/bin/python bench/gguf_slice.py --llama-bin $LLAMA_SRC/build/bin --rounds 2 \
#       OUT_DIR/flash23-q4k.gguf OUT_DIR/flash23-q2mix.gguf
#   .venv/bin/python bench/gguf_slice.py --llama-bin $LLAMA_SRC/build/bin --rounds 2 OUT_DIR/flash23-mxfp4.gguf
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/work/gguf23}
LLAMA_SRC=${LLAMA_SRC:-/work/llama-peer/llama_cpp_python-0.3.36/vendor/llama.cpp}
PY_CONVERT=${PY_CONVERT:-/work/venv-convert/bin/python}
MODEL=${MODEL:-/work/bench-flash23}
BIN=$LLAMA_SRC/build/bin
THREADS=${THREADS:-2}
mkdir -p "$OUT"

# 1. the model directory (official layout: FP8 linears, FP4 experts), V4-Flash layers 2-3
[[ -f $MODEL/config.json ]] || .venv/bin/cairn make-model --preset flash-slice --first-layer 2 --layers 2 "$MODEL"

# 2. GGUF as the stock converter writes it (MOSTLY_MXFP4_MOE)
[[ -f $OUT/flash23-mxfp4.gguf ]] || "$PY_CONVERT" bench/gguf_convert_official.py "$LLAMA_SRC" "$MODEL" "$OUT/flash23-mxfp4.gguf"

# 3. the mixes (q4 first; q2 after its importance matrix)
KEEP=(--pure --token-embedding-type bf16 --output-tensor-type bf16
      --tensor-type 'compressor_ape=f32' --tensor-type 'compressor_(gate|kv)=bf16'
      --tensor-type 'indexer\.proj=bf16' --tensor-type 'hc_.*fn=f32')
[[ -f $OUT/flash23-q4k.gguf ]] || "$BIN/llama-quantize" --allow-requantize \
    --tensor-type 'ffn_(gate|up|down)_exps=q4_k' "${KEEP[@]}" \
    "$OUT/flash23-mxfp4.gguf" "$OUT/flash23-q4k.gguf" Q8_0 "$THREADS"

# 4. importance matrix (only IQ2_XXS requires one; the q4 file is made without it)
if [[ ! -f $OUT/imatrix.gguf ]]; then
  cat docs/*.md > "$OUT/imatrix-text.txt"
  "$BIN/llama-imatrix" -m "$OUT/flash23-mxfp4.gguf" -f "$OUT/imatrix-text.txt" -o "$OUT/imatrix.gguf" \
      -t "$THREADS" -c 512 --chunks "${IMATRIX_CHUNKS:-8}" --no-ppl
fi

[[ -f $OUT/flash23-q2mix.gguf ]] || "$BIN/llama-quantize" --allow-requantize --imatrix "$OUT/imatrix.gguf" \
    --tensor-type 'ffn_(gate|up)_exps=iq2_xxs' --tensor-type 'ffn_down_exps=q2_k' "${KEEP[@]}" \
    "$OUT/flash23-mxfp4.gguf" "$OUT/flash23-q2mix.gguf" Q8_0 "$THREADS"

# 5. what each file holds
PYTHONPATH=$LLAMA_SRC/gguf-py .venv/bin/python bench/gguf_types.py "$OUT"/flash23-*.gguf
