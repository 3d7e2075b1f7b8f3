"""The official DeepSeek-V4 weight quantization, in numpy: which tensors, how they are encoded,
and the exact dequantization (the reference the kernel's quantized panels must reproduce bit for bit).

- FP8: e4m3fn codes [out, in], one ue8m0 scale byte per 128x128 block ([ceil(out/128),
  ceil(in/128)]), W = q * 2^(byte - 127).
- FP4 (routed experts when `expert_dtype` is "fp4"): e2m1 codes two per byte (I8 [out, in/2], the
  even column in the low nibble; magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6, bit 3 the sign), one ue8m0
  scale per row per 32 columns ([out, in/32]).
Both products are exact in fp32, so the dequantized matrix is exactly representable.
"""

from __future__ import annotations

import re

import numpy as np

QUANTIZATION_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                       "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
FP8_BLOCK, FP4_GROUP = 128, 32
FP8_MAX, FP4_MAX = 448.0, 6.0

_FP8_NAMES = re.compile(r"\.attn\.(wq_a|wq_b|wkv|wo_a|wo_b|indexer\.wq_b)\.weight$|\.ffn\.shared_experts\.w[123]\.weight$")
_EXPERT = re.compile(r"\.ffn\.experts\.\d+\.w[123]\.weight$")
# Kept F32 (not BF16) in the official release: hyper-connection parameters, sinks, position biases,
# router biases.
_F32_NAMES = re.compile(r"hc_(head|attn|ffn)_(fn|base|scale)$|attn_sink$|\.ape$|gate\.bias$")


def quantized_format(name: str, expert_dtype: str | None) -> str | None:
    """"fp8", "fp4" or None (kept in float) for a weight name in either spelling."""
    if expert_dtype is None:
        return None
    if _EXPERT.search(name):
        return expert_dtype
    return "fp8" if _FP8_NAMES.search(name) else None


def official_f32(name: str) -> bool:
    return bool(_F32_NAMES.search(name))


def _e4m3_values() -> np.ndarray:
    """Values of the positive e4m3fn codes 0..126 (127 is NaN), ascending."""
    c = np.arange(127)
    e, m = c >> 3, c & 7
    return np.where(e > 0, (8 + m) * 2.0 ** (e - 10), m * 2.0 ** -9)


_E4M3 = _e4m3_values()
_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _nearest(table: np.ndarray, mag: np.ndarray) -> np.ndarray:
    """Index of the nearest table value to each magnitude (table ascending)."""
    mids = (table[1:] + table[:-1]) / 2
    return np.searchsorted(mids, mag)


def _exponents(amax: np.ndarray, qmax: float) -> np.ndarray:
    """Smallest power-of-two scale with amax / scale <= qmax, as a ue8m0 byte."""
    with np.errstate(divide="ignore"):
        e = np.ceil(np.log2(np.maximum(amax, 1e-30) / qmax))
    return np.clip(e + 127, 1, 254).astype(np.uint8)


def quantize_fp8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """fp32 [out, in] -> (e4m3 codes uint8 [out, in], ue8m0 scales uint8 [ceil(out/128), ceil(in/128)])."""
    out, inp = w.shape
    ro, ri = -(-out // FP8_BLOCK), -(-inp // FP8_BLOCK)
    pad = np.zeros((ro * FP8_BLOCK, ri * FP8_BLOCK), np.float64)
    pad[:out, :inp] = w
    blocks = np.abs(pad).reshape(ro, FP8_BLOCK, ri, FP8_BLOCK).max(axis=(1, 3))
    scales = _exponents(blocks, FP8_MAX)
    s = np.exp2(scales.astype(np.float64) - 127)
    x = w / np.repeat(np.repeat(s, FP8_BLOCK, 0), FP8_BLOCK, 1)[:out, :inp]
    idx = _nearest(_E4M3, np.minimum(np.abs(x), FP8_MAX))
    codes = idx.astype(np.uint8) | np.where((x < 0) & (idx > 0), 0x80, 0).astype(np.uint8)
    return codes, scales


def quantize_fp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """fp32 [out, in] -> (packed e2m1 int8 [out, in/2], ue8m0 scales uint8 [out, in/32])."""
    out, inp = w.shape
    if inp % FP4_GROUP:
        raise ValueError(f"FP4 needs the input width ({inp}) to be a multiple of {FP4_GROUP}")
    g = np.abs(w).reshape(out, inp // FP4_GROUP, FP4_GROUP).max(axis=2)
    scales = _exponents(g, FP4_MAX)
    x = w / np.repeat(np.exp2(scales.astype(np.float64) - 127), FP4_GROUP, 1)
    idx = _nearest(_E2M1, np.minimum(np.abs(x), FP4_MAX))
    codes = idx.astype(np.uint8) | np.where((x < 0) & (idx > 0), 8, 0).astype(np.uint8)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed.view(np.int8), scales


def _scale_values(scales: np.ndarray) -> np.ndarray:
    return np.ldexp(np.float32(1), scales.astype(np.int32) - 127).astype(np.float32)


def dequantize_fp8(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The exact fp32 weights of e4m3 codes with their 128x128 block scales."""
    c = np.asarray(codes).view(np.uint8)
    out, inp = c.shape
    mag = np.concatenate([_E4M3, [np.nan]])[c & 0x7F]
    q = np.where(c & 0x80, -mag, mag).astype(np.float32)
    s = np.repeat(np.repeat(_scale_values(np.asarray(scales)), FP8_BLOCK, 0), FP8_BLOCK, 1)[:out, :inp]
    return q * s


def dequantize_fp4(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The exact fp32 weights of packed e2m1 pairs with their per-row, per-32 scales."""
    b = np.asarray(packed).view(np.uint8)
    codes = np.stack([b & 15, b >> 4], axis=-1).reshape(b.shape[0], 2 * b.shape[1])
    mag = _E2M1[codes & 7]
    q = np.where(codes & 8, -mag, mag).astype(np.float32)
    return q * np.repeat(_scale_values(np.asarray(scales)), FP4_GROUP, 1)
