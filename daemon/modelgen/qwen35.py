"""Deterministic random-weight Qwen3.5 model directories (`cairn make-model --preset qwen35*`, issue 43).

The second model family's test models: HF transformers' `qwen3_5` (dense) and `qwen3_5_moe` text models
(Gated DeltaNet layers interleaved with gated full attention), written the way HF 5.24 saves them, so HF
loads each directory unchanged and serves as the oracle (tests/native/hf_oracle_qwen35.py).

Layouts, all from one set of text weights per seed (the MoE presets compute the same logits):
- `Qwen3_5ForCausalLM` / `Qwen3_5MoeForCausalLM`: flat config (`model_type` `qwen3_5_text` /
  `qwen3_5_moe_text`), names `model.*`, routed experts per expert `mlp.experts.{e}.{gate,up,down}_proj.weight`
  (HF 5.24 fuses them at load through its `qwen2_moe` conversion and splits them again in save_pretrained);
- fused: the module's own 3-D parameters `mlp.experts.gate_up_proj [E,2I,D]` and `down_proj [E,D,I]`, which
  HF also loads as they are;
- `Qwen3_5MoeForConditionalGeneration` (how Qwen releases its checkpoints): config nests the text model
  under `text_config` beside a `vision_config`, names `model.language_model.*`, plus a toy vision tower
  (`model.visual.*`, complete, so HF's conditional class loads too) and a few `mtp.*` tensors (the
  multi-token-prediction head): a text loader ignores both.

Weight scales: projections ~ N(0, 1/fan_in) (unit-order activations, logits' std near 1); the zero-centred `(1+w)` norms
N(0, 0.1), the gated DeltaNet output norm (plain `w`) N(1, 0.1); decays well-conditioned for HF's chunked
prefill (its triangular solve and decay products): A = exp(A_log) uniform in [0.01, 1], dt_bias N(0, 0.1).
The chat template is the release's, `templates/qwen3_5.jinja`: copied unchanged from llama.cpp's
`models/templates/Qwen3.5-4B.jinja` (llama-cpp-python 0.3.36 sdist; Qwen's text, Apache-2.0).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .make_model import _write_weights, make_tokenizer
from cairn.daemon.weights.safetensors_io import to_bf16_bits

LIN, FULL = "linear_attention", "full_attention"

# Qwen's control tokens (special: skipped by decode(skip_special_tokens=True)), then the markup tokens
# the release adds as whole tokens that are not special (they decode as text), as in its tokenizer.json.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
MARKUP_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
EOS, PAD = "<|im_end|>", "<|endoftext|>"

QK_SHARE = np.float32(0.7)   # see make_text_weights

TEMPLATE = Path(__file__).parent / "templates" / "qwen3_5.jinja"


@dataclass(frozen=True)
class Qwen35Preset:
    """Text-model hyper-parameters in HF config field names, and the file layout."""

    layer_types: tuple[str, ...]
    vocab_size: int = 512
    hidden_size: int = 64
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    partial_rotary_factor: float = 0.25
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_key_head_dim: int = 16
    linear_value_head_dim: int = 16
    linear_conv_kernel_dim: int = 4
    intermediate_size: int = 0           # dense MLP width (qwen3_5); 0 for MoE
    num_experts: int = 0                 # routed experts (qwen3_5_moe); 0 for dense
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    tie_word_embeddings: bool = False
    layout: str = "causal"               # "causal" (*ForCausalLM) or "cond" (*ForConditionalGeneration)
    fused_experts: bool = False          # 3-D expert tensors instead of per-expert names
    max_position_embeddings: int = 65536
    rope_theta: float = 10_000_000.0     # the release's

    @property
    def moe(self) -> bool:
        return self.num_experts > 0


_TINY = dict(layer_types=(LIN, LIN, FULL, LIN, LIN, FULL))
_TINY_MOE = dict(_TINY, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                 shared_expert_intermediate_size=32)

PRESETS: dict[str, Qwen35Preset] = {
    # Dense qwen3_5 with tied embeddings (as the small dense releases).
    "qwen35-tiny": Qwen35Preset(**_TINY, intermediate_size=128, tie_word_embeddings=True),
    # qwen3_5_moe as Qwen3_5MoeForCausalLM saves it.
    "qwen35moe-tiny": Qwen35Preset(**_TINY_MOE),
    # The same text model in the release's conditional-generation layout (vision tower, MTP head).
    "qwen35moe-tiny-cond": Qwen35Preset(**_TINY_MOE, layout="cond"),
    # The same text model with fused 3-D expert tensors.
    "qwen35moe-tiny-fused": Qwen35Preset(**_TINY_MOE, fused_experts=True),
}

# Benchmark shapes, apart from PRESETS (the tests build and check every one of those at the tiny shape);
# make_model takes them as Qwen35Preset values. `qwen35moe-agent` (bench/qwen35_session.py, issue 43 §5):
# Qwen3.5-35B-A3B's attention and Gated DeltaNet at their real width, in its 3 : 1 pattern, with 8 layers
# and small experts so a 2-core machine runs an agent session on it (~343M parameters, 1.4 GB fp32); a
# vocabulary of 8192 like `small`.
BENCH_PRESETS: dict[str, Qwen35Preset] = {
    "qwen35moe-agent": Qwen35Preset(
        layer_types=(LIN, LIN, LIN, FULL) * 2, vocab_size=8192, hidden_size=2048, num_attention_heads=16,
        num_key_value_heads=2, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=32,
        linear_key_head_dim=128, linear_value_head_dim=128, num_experts=16, num_experts_per_tok=4,
        moe_intermediate_size=64, shared_expert_intermediate_size=64),
}

# The toy vision tower of the cond layout (Qwen3_5MoeVisionConfig field names): one block.
_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3, patch_size=4,
               temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16)


def _token_ids() -> dict[str, int]:
    # The trainer puts the special tokens first, in order (make_tokenizer).
    return {t: i for i, t in enumerate(SPECIAL_TOKENS + MARKUP_TOKENS)}


def text_config(p: Qwen35Preset) -> dict:
    ids = _token_ids()
    cfg = {
        "model_type": "qwen3_5_moe_text" if p.moe else "qwen3_5_text",
        "vocab_size": p.vocab_size,
        "hidden_size": p.hidden_size,
        "num_hidden_layers": len(p.layer_types),
        "layer_types": list(p.layer_types),
        "num_attention_heads": p.num_attention_heads,
        "num_key_value_heads": p.num_key_value_heads,
        "head_dim": p.head_dim,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": p.rope_theta,
                            "partial_rotary_factor": p.partial_rotary_factor,
                            # text positions are equal on all three rows: the sections are the identity
                            "mrope_interleaved": True,
                            "mrope_section": _mrope_section(int(p.head_dim * p.partial_rotary_factor) // 2)},
        "linear_conv_kernel_dim": p.linear_conv_kernel_dim,
        "linear_key_head_dim": p.linear_key_head_dim,
        "linear_value_head_dim": p.linear_value_head_dim,
        "linear_num_key_heads": p.linear_num_key_heads,
        "linear_num_value_heads": p.linear_num_value_heads,
        "max_position_embeddings": p.max_position_embeddings,
        "tie_word_embeddings": p.tie_word_embeddings,
        "use_cache": True,
        "initializer_range": 0.02,
        "bos_token_id": None,
        "eos_token_id": ids[EOS],
        "pad_token_id": ids[PAD],
    }
    if p.moe:
        cfg.update(num_experts=p.num_experts, num_experts_per_tok=p.num_experts_per_tok,
                   moe_intermediate_size=p.moe_intermediate_size,
                   shared_expert_intermediate_size=p.shared_expert_intermediate_size,
                   router_aux_loss_coef=0.001, output_router_logits=False)
    else:
        cfg["intermediate_size"] = p.intermediate_size
    return cfg


def _mrope_section(half: int) -> list[int]:
    # The release splits r/2 = 32 as [11, 11, 10]; the same proportions at any width.
    a = (half + 2) // 3
    return [a, a, half - 2 * a]


def hf_config(p: Qwen35Preset, dtype: str) -> dict:
    text = text_config(p)
    if p.layout == "causal":
        arch = "Qwen3_5MoeForCausalLM" if p.moe else "Qwen3_5ForCausalLM"
        return {"architectures": [arch], **text, "dtype": dtype}
    if not p.moe:
        raise ValueError("the cond layout is written for qwen3_5_moe presets only")
    ids = _token_ids()
    text["mtp_num_hidden_layers"] = 1
    text["dtype"] = dtype
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": text,
        "vision_config": {"model_type": "qwen3_5_moe_vision", **_VISION, "out_hidden_size": p.hidden_size,
                          "hidden_act": "gelu_pytorch_tanh", "initializer_range": 0.02},
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "tie_word_embeddings": p.tie_word_embeddings,
        "dtype": dtype,
    }


def make_text_weights(p: Qwen35Preset, seed: int) -> dict[str, np.ndarray]:
    """The text model's weights (fp32), canonical spelling: HF's `model.*` names, experts per expert.
    The draw order does not depend on the layout, so every MoE layout of a seed holds the same numbers."""
    rng = np.random.default_rng(seed)
    D, V = p.hidden_size, p.vocab_size
    nk, nv, dk, dv, K = (p.linear_num_key_heads, p.linear_num_value_heads, p.linear_key_head_dim,
                         p.linear_value_head_dim, p.linear_conv_kernel_dim)
    key_dim, value_dim = nk * dk, nv * dv
    conv_dim = 2 * key_dim + value_dim
    H, Hkv, Dh = p.num_attention_heads, p.num_key_value_heads, p.head_dim
    w: dict[str, np.ndarray] = {}

    def lin(name: str, out_f: int, in_f: int, gain: float = 1.0) -> None:
        w[name] = rng.standard_normal((out_f, in_f), dtype=np.float32) * np.float32(gain / np.sqrt(in_f))

    def vec(name: str, shape, mean: float, std: float) -> None:
        w[name] = (mean + std * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)

    def mlp(prefix: str, inter: int) -> None:
        lin(prefix + "gate_proj.weight", inter, D)
        lin(prefix + "up_proj.weight", inter, D)
        lin(prefix + "down_proj.weight", D, inter)

    # Tied, the embedding is also the head: rows ~ N(0, 1/D) keep the logits' std near 1 (the first
    # RMSNorm makes the input scale irrelevant).
    vec("model.embed_tokens.weight", (V, D), 0.0, 1.0 / np.sqrt(D) if p.tie_word_embeddings else 1.0)
    for i, kind in enumerate(p.layer_types):
        L = f"model.layers.{i}."
        vec(L + "input_layernorm.weight", (D,), 0.0, 0.1)          # zero-centred: scales by 1 + w
        vec(L + "post_attention_layernorm.weight", (D,), 0.0, 0.1)
        if kind == LIN:
            G = L + "linear_attn."
            lin(G + "in_proj_qkv.weight", conv_dim, D)                # channels q | k | v
            lin(G + "in_proj_z.weight", value_dim, D)
            lin(G + "in_proj_b.weight", nv, D)
            lin(G + "in_proj_a.weight", nv, D)
            vec(G + "conv1d.weight", (conv_dim, 1, K), 0.0, 1.0 / np.sqrt(K))
            vec(G + "dt_bias", (nv,), 0.0, 0.1)
            # g = -A * softplus(a + dt_bias) with A in [0.01, 1]: per-token decays exp(g) stay near 0.1..1
            w[G + "A_log"] = np.log(rng.uniform(0.01, 1.0, nv)).astype(np.float32)
            vec(G + "norm.weight", (dv,), 1.0, 0.1)                  # plain w, not 1 + w
            lin(G + "out_proj.weight", D, value_dim)
            # k's projection rows and conv taps share QK_SHARE of q's, so q.k is not near zero at the first
            # tokens: there o = (q.k) * beta * v, the gated norm rescales it to unit RMS, and a near-zero o
            # turns fp32 rounding into ~1e-4 logit noise (measured: 1.5e-4 -> 4e-5 against float64).
            for t in (G + "in_proj_qkv.weight", G + "conv1d.weight"):
                w[t][key_dim:2 * key_dim] = (QK_SHARE * w[t][:key_dim]
                                             + np.float32(np.sqrt(1 - QK_SHARE ** 2)) * w[t][key_dim:2 * key_dim])
        elif kind == FULL:
            A = L + "self_attn."
            lin(A + "q_proj.weight", 2 * H * Dh, D)                   # per head: query Dh | gate Dh
            lin(A + "k_proj.weight", Hkv * Dh, D)
            lin(A + "v_proj.weight", Hkv * Dh, D)
            lin(A + "o_proj.weight", D, H * Dh)
            vec(A + "q_norm.weight", (Dh,), 0.0, 0.1)
            vec(A + "k_norm.weight", (Dh,), 0.0, 0.1)
        else:
            raise ValueError(f"layer_types[{i}] is {kind!r}; allowed: {LIN!r}, {FULL!r}")
        M = L + "mlp."
        if p.moe:
            lin(M + "gate.weight", p.num_experts, D)
            for e in range(p.num_experts):
                mlp(f"{M}experts.{e}.", p.moe_intermediate_size)
            mlp(M + "shared_expert.", p.shared_expert_intermediate_size)
            lin(M + "shared_expert_gate.weight", 1, D)
        else:
            mlp(M, p.intermediate_size)
    vec("model.norm.weight", (D,), 0.0, 0.1)
    if not p.tie_word_embeddings:
        lin("lm_head.weight", V, D)
    return w


def fuse_experts(w: dict[str, np.ndarray], n_layers: int, n_experts: int) -> dict[str, np.ndarray]:
    """Per-expert tensors -> the 3-D `gate_up_proj [E,2I,D]` (gate rows, then up rows) and
    `down_proj [E,D,I]` of HF's Qwen3_5MoeExperts."""
    out = dict(w)
    for i in range(n_layers):
        M = f"model.layers.{i}.mlp.experts."
        names = [f"{M}{e}.{part}_proj.weight" for e in range(n_experts) for part in ("gate", "up", "down")]
        if names[0] not in w:
            continue
        out[M + "gate_up_proj"] = np.stack([np.concatenate([w[f"{M}{e}.gate_proj.weight"],
                                                            w[f"{M}{e}.up_proj.weight"]]) for e in range(n_experts)])
        out[M + "down_proj"] = np.stack([w[f"{M}{e}.down_proj.weight"] for e in range(n_experts)])
        for n in names:
            del out[n]
    return out


def extra_cond_weights(p: Qwen35Preset, seed: int) -> dict[str, np.ndarray]:
    """A toy vision tower (`model.visual.*`, every tensor HF's Qwen3_5MoeVisionModel has) and an MTP
    head (`mtp.*`, a few of the release's names): present in the files, ignored by a text loader. Drawn
    from their own generator so the text weights stay those of the other layouts."""
    rng = np.random.default_rng([seed, 1])
    v, D = _VISION, p.hidden_size
    h, f = v["hidden_size"], v["intermediate_size"]
    m = h * v["spatial_merge_size"] ** 2
    shapes = {
        "model.visual.patch_embed.proj.weight": (h, v["in_channels"], v["temporal_patch_size"], v["patch_size"],
                                                 v["patch_size"]),
        "model.visual.patch_embed.proj.bias": (h,),
        "model.visual.pos_embed.weight": (v["num_position_embeddings"], h),
        "model.visual.merger.norm.weight": (h,), "model.visual.merger.norm.bias": (h,),
        "model.visual.merger.linear_fc1.weight": (m, m), "model.visual.merger.linear_fc1.bias": (m,),
        "model.visual.merger.linear_fc2.weight": (D, m), "model.visual.merger.linear_fc2.bias": (D,),
        "mtp.fc.weight": (D, 2 * D),
        "mtp.pre_fc_norm_embedding.weight": (D,),
        "mtp.pre_fc_norm_hidden.weight": (D,),
        "mtp.norm.weight": (D,),
        "mtp.layers.0.input_layernorm.weight": (D,),
    }
    for b in range(v["depth"]):
        B = f"model.visual.blocks.{b}."
        shapes.update({
            B + "norm1.weight": (h,), B + "norm1.bias": (h,), B + "norm2.weight": (h,), B + "norm2.bias": (h,),
            B + "attn.qkv.weight": (3 * h, h), B + "attn.qkv.bias": (3 * h,),
            B + "attn.proj.weight": (h, h), B + "attn.proj.bias": (h,),
            B + "mlp.linear_fc1.weight": (f, h), B + "mlp.linear_fc1.bias": (f,),
            B + "mlp.linear_fc2.weight": (h, f), B + "mlp.linear_fc2.bias": (h,),
        })
    return {name: (0.05 * rng.standard_normal(shape)).astype(np.float32) for name, shape in sorted(shapes.items())}


def file_weights(p: Qwen35Preset, seed: int) -> dict[str, np.ndarray]:
    """The tensors as the preset's layout names them."""
    w = make_text_weights(p, seed)
    if p.fused_experts:
        w = fuse_experts(w, len(p.layer_types), p.num_experts)
    if p.layout == "cond":
        w = {("model.language_model." + k.removeprefix("model.")) if k.startswith("model.") else k: a
             for k, a in w.items()}
        w.update(extra_cond_weights(p, seed))
    return w


# ---------------------------------------------------------------------------------------------
# Tokenizer: the shared byte-level BPE trainer with Qwen's tokens.

QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def make_qwen_tokenizer(vocab_size: int):
    """Byte-level BPE (make_tokenizer's trainer and corpus) with Qwen's control tokens and markup
    tokens at ids 0.. (each encodes as one id); the markup tokens are not `special`, as in the release."""
    from tokenizers import Tokenizer

    tok = make_tokenizer(vocab_size, special_tokens=SPECIAL_TOKENS + MARKUP_TOKENS)
    doc = json.loads(tok.to_str())
    # the release's normalizer and pre-tokenizer (digits one by one), which HF's Qwen3_5Tokenizer
    # applies whatever the file says: the file must say the same, or a reader of tokenizer.json
    # (cairn) and HF split " 12" differently
    doc["normalizer"] = {"type": "NFC"}
    doc["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN_SPLIT}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    for added in doc["added_tokens"]:
        if added["content"] in MARKUP_TOKENS:
            added["special"] = False
    return Tokenizer.from_str(json.dumps(doc, ensure_ascii=False))


def tokenizer_config(max_len: int) -> dict:
    return {
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": PAD,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": max_len,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "chat_template": TEMPLATE.read_text(),
    }


# ---------------------------------------------------------------------------------------------
# FP8, as Qwen's FP8 releases store it: e4m3fn codes, one BF16 scale per 128 x 128 block
# (`<name>_scale_inv`, W = code x scale), on every linear of the decoder but the ones the release keeps
# in BF16 (`modules_to_not_convert`).

FP8_QUANTIZATION_CONFIG = {
    "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
    "modules_to_not_convert": ["lm_head", "embed_tokens", "mlp.gate", "shared_expert_gate", "linear_attn.in_proj_a",
                               "linear_attn.in_proj_b", "linear_attn.conv1d", "model.visual", "mtp"],
}
_FP8 = re.compile(r"\.(self_attn\.[qkvo]_proj|linear_attn\.(in_proj_qkv|in_proj_z|out_proj)"
                  r"|mlp\.(shared_expert\.|experts\.\d+\.)?(gate|up|down)_proj)\.weight$")


def fp8_quantized(name: str) -> bool:
    """Whether the FP8 release stores this tensor (a file name) as FP8."""
    return not name.startswith(("model.visual.", "mtp.")) and bool(_FP8.search(name))


def quantize_fp8_blocks(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """fp32 [out, in] -> (e4m3fn codes uint8 [out, in], BF16 scale bits [ceil(out/128), ceil(in/128)]):
    scale = the block's max |w| / 448, rounded to BF16 (what is stored), codes the nearest e4m3 of w / scale."""
    from .quantize import FP8_BLOCK, FP8_MAX, _E4M3, _nearest

    out, inp = w.shape
    ro, ri = -(-out // FP8_BLOCK), -(-inp // FP8_BLOCK)
    pad = np.zeros((ro * FP8_BLOCK, ri * FP8_BLOCK), np.float32)
    pad[:out, :inp] = w
    amax = np.abs(pad).reshape(ro, FP8_BLOCK, ri, FP8_BLOCK).max(axis=(1, 3))
    bits = to_bf16_bits(np.maximum(amax, np.float32(1e-12)) / np.float32(FP8_MAX))
    scale = (bits.astype(np.uint32) << 16).view(np.float32)
    x = w.astype(np.float64) / np.repeat(np.repeat(scale, FP8_BLOCK, 0), FP8_BLOCK, 1)[:out, :inp]
    idx = _nearest(_E4M3, np.minimum(np.abs(x), FP8_MAX))
    codes = idx.astype(np.uint8) | np.where((x < 0) & (idx > 0), 0x80, 0).astype(np.uint8)
    return codes, bits


def make_qwen35(preset: str | Qwen35Preset, seed: int, out_dir: str | os.PathLike, *, dtype: str = "float32",
                shard_bytes: int | None = None) -> Path:
    """Write a Qwen3.5 model directory (see the module doc). Returns its path."""
    if isinstance(preset, str) and preset not in PRESETS:
        raise ValueError(f"unknown Qwen3.5 preset {preset!r}; choose from {', '.join(PRESETS)}")
    if dtype not in ("float32", "bfloat16", "float16", "fp8"):
        raise ValueError(f"dtype must be float32, bfloat16, float16 or fp8, got {dtype!r}")
    p = PRESETS[preset] if isinstance(preset, str) else preset
    if dtype == "fp8" and p.fused_experts:
        raise ValueError("the FP8 release layout has per-expert tensors: fp8 takes no fused_experts preset")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    def encode(arr: np.ndarray) -> tuple[np.ndarray, str]:
        if dtype in ("bfloat16", "fp8"):
            return to_bf16_bits(arr), "BF16"
        if dtype == "float16":
            return arr.astype(np.float16), "F16"
        return arr.astype(np.float32), "F32"

    encoded = {}
    for k, a in file_weights(p, seed).items():
        if dtype == "fp8" and fp8_quantized(k):
            codes, scales = quantize_fp8_blocks(a)
            encoded[k], encoded[k + "_scale_inv"] = (codes, "F8_E4M3"), (scales, "BF16")
        else:
            encoded[k] = encode(a)
    _write_weights(out, encoded, shard_bytes)
    ids = _token_ids()
    config = hf_config(p, "bfloat16" if dtype == "fp8" else dtype)
    if dtype == "fp8":
        config["quantization_config"] = dict(FP8_QUANTIZATION_CONFIG)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tok = make_qwen_tokenizer(p.vocab_size)
    (out / "tokenizer.json").write_text(tok.to_str(pretty=True) + "\n")
    (out / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(p.max_position_embeddings), indent=2, ensure_ascii=False, sort_keys=True) + "\n")
    # The release stops on either end marker; <|im_end|> is the one its template writes.
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [ids[EOS], ids[PAD]], "pad_token_id": ids[PAD]}, indent=2, sort_keys=True) + "\n")
    return out
