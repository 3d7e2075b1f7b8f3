"""A GGUF model as the HF-style F32 model directory it stands for: the oracle input for quantized GGUF
files (issue 23). HF transformers and cairn's fp32 path run on the dequantized weights; the quantized
path must equal the latter bit for bit.

    .venv/bin/python scripts/dequantize_gguf.py MODEL.gguf OUT_DIR

The directory is what `cairn make-model` writes (config.json in HF field names, model.safetensors in
HF's save_pretrained spelling, tokenizer.json, tokenizer_config.json with the chat template,
generation_config.json): config from the GGUF metadata (as cairn reads it: gguf_dir.config_from_metadata),
the tokenizer cairn rebuilds from tokenizer.ggml.*, every tensor widened to F32 by gguf.quants.dequantize
(llama.cpp's own reference decoding; F16/BF16/F32 exactly), the routing table as I64.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

# canonical -> HF save_pretrained spelling (model_dir.canonical_name is the other way)
_HF_TOP = {
    "embed.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "hc_head_fn": "model.hc_head.hc_fn",
    "hc_head_base": "model.hc_head.hc_base",
    "hc_head_scale": "model.hc_head.hc_scale",
    "head.weight": "head.weight",
}


def hf_name(canonical: str) -> str:
    if canonical in _HF_TOP:
        return _HF_TOP[canonical]
    if not canonical.startswith("layers."):
        raise ValueError(f"no HF name for tensor {canonical!r}")
    if re.match(r"layers\.\d+\.attn\.kv_norm\.weight$", canonical):
        canonical = canonical.removesuffix("kv_norm.weight") + "norm.weight"   # HF's attn.norm
    return "model." + canonical


def hf_config(meta_config: dict) -> dict:
    """gguf_dir.config_from_metadata's fields -> a config.json HF's DeepseekV4Config takes (the fields
    make_model.hf_config writes)."""
    cfg = dict(meta_config)
    prf = cfg.pop("qk_rope_head_dim") / cfg["head_dim"]
    scaling = cfg.pop("rope_scaling", None)
    compress = {"rope_type": "default"} if scaling is None else dict(scaling)
    compress.update(rope_theta=cfg["compress_rope_theta"], partial_rotary_factor=prf)
    cfg.update({
        "architectures": ["DeepseekV4ForCausalLM"],
        "num_key_value_heads": 1,
        "partial_rotary_factor": prf,
        "rope_parameters": {"main": {"rope_type": "default", "rope_theta": cfg["rope_theta"],
                                     "partial_rotary_factor": prf},
                            "compress": compress},
        "scoring_func": "sqrtsoftplus",
        "norm_topk_prob": True,
        "num_nextn_predict_layers": 0,
        "tie_word_embeddings": False,
        "dtype": "float32",
    })
    return cfg


def dequantize_tensor(raw: np.ndarray, tag: str, shape: tuple[int, ...]) -> np.ndarray:
    """One mapped tensor (model_dir.map_weights' array and tag) as F32 (integers as I64)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    if tag.startswith("GGML:"):
        out = dequantize(np.ascontiguousarray(raw), GGMLQuantizationType[tag.removeprefix("GGML:")])
    elif tag == "BF16":
        out = (raw.astype(np.uint32) << 16).view(np.float32)
    elif tag in ("I32", "I64"):
        return raw.astype(np.int64)
    else:
        out = raw.astype(np.float32)
    out = np.asarray(out, np.float32)
    if out.shape != shape:
        raise ValueError(f"dequantized to shape {list(out.shape)}, expected {list(shape)}")
    return out


def dequantized_model_dir(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """Write the HF-style F32 model directory of a GGUF model (one file or a split set); return it."""
    from gguf import GGUFReader

    from cairn.daemon.modelgen.make_model import tokenizer_config
    from cairn.daemon.weights.dsv4.gguf import config_from_metadata
    from cairn.daemon.weights.gguf_dir import _fields
    from cairn.daemon.weights.model_dir import map_weights, open_model_dir
    from cairn.daemon.weights.safetensors_io import write_file

    md = open_model_dir(gguf_path)
    meta = _fields(GGUFReader(md.path))
    cfg = hf_config(config_from_metadata(meta, str(md.path)))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, (raw, tag) in map_weights(md).items():
        arr = dequantize_tensor(raw, tag, md.tensors[name].shape)
        tensors[hf_name(name)] = (arr, "I64" if arr.dtype == np.int64 else "F32")
    write_file(out / "model.safetensors", tensors)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (out / "tokenizer.json").write_text(md.tokenizer_json + "\n")
    tok_cfg = tokenizer_config(cfg["max_position_embeddings"])
    tokens = meta["tokenizer.ggml.tokens"]
    pad = meta.get("tokenizer.ggml.padding_token_id")
    tok_cfg.update(bos_token=md.bos_token, eos_token=md.eos_token, chat_template=md.chat_template,
                   pad_token=tokens[pad] if isinstance(pad, int) and 0 <= pad < len(tokens) else None)
    tok_cfg = {k: v for k, v in tok_cfg.items() if v is not None}
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2, ensure_ascii=False, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"]}, indent=2,
                   sort_keys=True) + "\n")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", help="a .gguf file (the first of a split set)")
    ap.add_argument("out", help="the directory to write")
    a = ap.parse_args()
    print(dequantized_model_dir(a.gguf, a.out))


if __name__ == "__main__":
    sys.exit(main())
