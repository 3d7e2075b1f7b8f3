"""Qwen3.5's weights: every tensor the config needs with its shape, HF's names (`model.` or
`model.language_model.` prefixed) mapped to the canonical ones, and the fused 3-D experts split into
per-expert byte ranges (docs/model-format.md, "Qwen3.5").

Canonical spelling: HF's name without its prefix, routed experts per expert
(`layers.L.mlp.experts.E.{gate,up,down}_proj.weight`).
"""

from __future__ import annotations

import dataclasses
import re

from ..errors import ModelDirError
from ..safetensors_io import DTYPES, TensorInfo
from .config import FULL, LIN, conv_dim, is_moe

IGNORED = "model.visual.* (vision tower), mtp.* (multi-token-prediction head)"
_PREFIXES = ("model.language_model.", "model.")


def canonical_name(name: str) -> str | None:
    """HF's name -> canonical; None for the vision tower and the MTP head (not the text model's)."""
    if name.startswith(("model.visual.", "mtp.", "model.mtp.")):
        return None
    for p in _PREFIXES:
        if name.startswith(p):
            return name[len(p):]
    return name   # lm_head.weight


def expected_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor the model needs, by canonical name, with its shape."""
    D, V = cfg["hidden_size"], cfg["vocab_size"]
    H, Hkv, Dh = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    nv, dv, K = cfg["linear_num_value_heads"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    cd, vd = conv_dim(cfg), nv * dv
    s: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (V, D), "norm.weight": (D,)}
    if not cfg["tie_word_embeddings"]:
        s["lm_head.weight"] = (V, D)
    for i, kind in enumerate(cfg["layer_types"]):
        L = f"layers.{i}."
        s |= {L + "input_layernorm.weight": (D,), L + "post_attention_layernorm.weight": (D,)}
        if kind == LIN:
            G = L + "linear_attn."
            s |= {G + "in_proj_qkv.weight": (cd, D), G + "in_proj_z.weight": (vd, D), G + "in_proj_b.weight": (nv, D),
                  G + "in_proj_a.weight": (nv, D), G + "conv1d.weight": (cd, 1, K), G + "dt_bias": (nv,),
                  G + "A_log": (nv,), G + "norm.weight": (dv,), G + "out_proj.weight": (D, vd)}
        elif kind == FULL:
            A = L + "self_attn."
            s |= {A + "q_proj.weight": (2 * H * Dh, D), A + "k_proj.weight": (Hkv * Dh, D),
                  A + "v_proj.weight": (Hkv * Dh, D), A + "o_proj.weight": (D, H * Dh),
                  A + "q_norm.weight": (Dh,), A + "k_norm.weight": (Dh,)}
        M = L + "mlp."
        if is_moe(cfg):
            E, I, Is = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
            s[M + "gate.weight"] = (E, D)
            for e in range(E):
                s |= _mlp(f"{M}experts.{e}.", I, D)
            s |= _mlp(M + "shared_expert.", Is, D)
            s[M + "shared_expert_gate.weight"] = (1, D)
        else:
            s |= _mlp(M, cfg["intermediate_size"], D)
    return s


def _mlp(prefix: str, inter: int, D: int) -> dict[str, tuple[int, ...]]:
    return {prefix + "gate_proj.weight": (inter, D), prefix + "up_proj.weight": (inter, D),
            prefix + "down_proj.weight": (D, inter)}


def is_routed_expert(name: str) -> bool:
    """A routed expert's weight (`layers.L.mlp.experts.E.*`); the shared expert is dense."""
    return ".mlp.experts." in name


_FUSED = re.compile(r"layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")


def split_fused_experts(tensors: dict[str, TensorInfo], cfg: dict) -> dict[str, TensorInfo]:
    """HF's fused 3-D experts (`mlp.experts.gate_up_proj [E,2I,D]`: gate rows then up rows;
    `mlp.experts.down_proj [E,D,I]`) -> per-expert canonical names, each a byte range of the fused
    tensor (no copy). Other tensors pass through; a fused tensor of the wrong shape is named."""
    out: dict[str, TensorInfo] = {}
    for name, info in tensors.items():
        m = _FUSED.match(name)
        if m is None:
            out[name] = info
            continue
        if not is_moe(cfg):
            raise ModelDirError(f"{info.file}: tensor {info.name!r} is a routed-expert tensor but config.json "
                                "has no num_experts")
        E, I, D = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["hidden_size"]
        layer, part = m.group(1), m.group(2)
        want = (E, 2 * I, D) if part == "gate_up_proj" else (E, D, I)
        if info.shape != want:
            raise ModelDirError(f"{info.file}: tensor {info.name!r} has shape {list(info.shape)}, expected "
                                f"{list(want)} ([num_experts, {'2*moe_intermediate_size, hidden_size' if part == 'gate_up_proj' else 'hidden_size, moe_intermediate_size'}]) from config.json")
        if info.dtype not in DTYPES:
            raise ModelDirError(f"{info.file}: tensor {info.name!r} has dtype {info.dtype}; fused experts are read "
                                "as F32, BF16 or F16")
        item = DTYPES[info.dtype].itemsize
        each = want[1] * want[2] * item
        for e in range(E):
            start = info.start + e * each
            P = f"layers.{layer}.mlp.experts.{e}."
            if part == "down_proj":
                out[P + "down_proj.weight"] = _view(info, f"[{e}]", (D, I), start, each)
            else:
                half = I * D * item
                out[P + "gate_proj.weight"] = _view(info, f"[{e}, :{I}]", (I, D), start, half)
                out[P + "up_proj.weight"] = _view(info, f"[{e}, {I}:]", (I, D), start + half, half)
    return out


def _view(info: TensorInfo, index: str, shape: tuple[int, ...], start: int, nbytes: int) -> TensorInfo:
    return dataclasses.replace(info, name=info.name + index, shape=shape, start=start, end=start + nbytes)
