"""DeepSeek-V4's weights: every tensor the config needs with its shape, the two spellings (HF's
save_pretrained and the official one) mapped to one canonical name, and the quantized layout
(docs/model-format.md, "Quantized checkpoints")."""

from __future__ import annotations

from ..errors import ModelDirError
from ..safetensors_io import TensorInfo
from .config import CSA, SLIDING


def expected_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor the model needs, by canonical name, with its shape."""
    D, N, V = cfg["hidden_size"], cfg["hc_mult"], cfg["vocab_size"]
    H, Dh, Rq = cfg["num_attention_heads"], cfg["head_dim"], cfg["q_lora_rank"]
    G, Ro, I, E = cfg["o_groups"], cfg["o_lora_rank"], cfg["moe_intermediate_size"], cfg["n_routed_experts"]
    nI, Di = cfg["index_n_heads"], cfg["index_head_dim"]
    s: dict[str, tuple[int, ...]] = {
        "embed.weight": (V, D), "head.weight": (V, D), "norm.weight": (D,),
        "hc_head_fn": (N, N * D), "hc_head_base": (N,), "hc_head_scale": (1,),
    }
    for i, kind in enumerate(cfg["layer_types"]):
        L = f"layers.{i}."
        A = L + "attn."
        s |= {L + "attn_norm.weight": (D,), L + "ffn_norm.weight": (D,)}
        for blk in ("attn", "ffn"):
            s |= {f"{L}hc_{blk}_fn": ((2 + N) * N, N * D), f"{L}hc_{blk}_base": ((2 + N) * N,),
                  f"{L}hc_{blk}_scale": (3,)}
        s |= {A + "wq_a.weight": (Rq, D), A + "q_norm.weight": (Rq,), A + "wq_b.weight": (H * Dh, Rq),
              A + "wkv.weight": (Dh, D), A + "kv_norm.weight": (Dh,), A + "wo_a.weight": (G * Ro, H * Dh // G),
              A + "wo_b.weight": (D, G * Ro), A + "attn_sink": (H,)}
        if kind != SLIDING:
            rate, width = (cfg["csa_rate"], 2 * Dh) if kind == CSA else (cfg["hca_rate"], Dh)
            s |= {A + "compressor.wkv.weight": (width, D), A + "compressor.wgate.weight": (width, D),
                  A + "compressor.ape": (rate, width), A + "compressor.norm.weight": (Dh,)}
        if kind == CSA:
            m = cfg["csa_rate"]
            s |= {A + "indexer.compressor.wkv.weight": (2 * Di, D), A + "indexer.compressor.wgate.weight": (2 * Di, D),
                  A + "indexer.compressor.ape": (m, 2 * Di), A + "indexer.compressor.norm.weight": (Di,),
                  A + "indexer.wq_b.weight": (nI * Di, Rq), A + "indexer.weights_proj.weight": (nI, D)}
        F = L + "ffn."
        s[F + "gate.weight"] = (E, D)
        if cfg["mlp_layer_types"][i] == "hash_moe":
            s[F + "gate.tid2eid"] = (V, cfg["num_experts_per_tok"])
        else:
            s[F + "gate.bias"] = (E,)
        for e in range(E):
            s |= {f"{F}experts.{e}.w1.weight": (I, D), f"{F}experts.{e}.w2.weight": (D, I),
                  f"{F}experts.{e}.w3.weight": (I, D)}
        s |= {F + "shared_experts.w1.weight": (I, D), F + "shared_experts.w2.weight": (D, I),
              F + "shared_experts.w3.weight": (I, D)}
    return s


_TOP_LEVEL = {
    "embed_tokens.weight": "embed.weight",
    "hc_head.hc_fn": "hc_head_fn",
    "hc_head.hc_base": "hc_head_base",
    "hc_head.hc_scale": "hc_head_scale",
    "lm_head.weight": "head.weight",
}


def canonical_name(name: str) -> str | None:
    """HF save_pretrained or official spelling -> canonical; None for tensors we ignore (mtp.*)."""
    n = name.removeprefix("model.")
    if n.startswith("mtp."):
        return None
    if n.endswith(".weight_scale_inv"):  # HF's name for the official block scale `W.scale`
        n = n[: -len("weight_scale_inv")] + "scale"
    n = _TOP_LEVEL.get(n, n)
    if n.startswith("layers.") and n.endswith(".attn.norm.weight"):
        n = n[: -len("norm.weight")] + "kv_norm.weight"  # HF writes the attention kv_norm as attn.norm
    return n


def is_routed_expert(name: str) -> bool:
    """A routed expert's weight or scale (canonical name `layers.L.ffn.experts.E.wN.*`); the shared
    expert (`ffn.shared_experts`) is dense: every token uses it."""
    return ".ffn.experts." in name


QUANTIZED_DTYPES = ("F8_E4M3", "I8")
FP8_BLOCK, FP4_GROUP = 128, 32


def scale_name(weight: str) -> str:
    """`X.weight` -> its block scale `X.scale` (canonical spelling)."""
    return weight.removesuffix("weight") + "scale"


def check_quantized(name: str, info: TensorInfo, shape: tuple[int, ...], tensors: dict[str, TensorInfo],
                    quant: dict | None) -> str:
    """Check a quantized weight and its scale against the config; return the scale's name.
    F8_E4M3 [out, in] with a ue8m0 scale per 128x128 block; I8 [out, in/2] (two FP4 e2m1 values
    per byte, low nibble = even column; routed experts only) with a ue8m0 scale per row per 32."""
    where = f"{info.file}: tensor {info.name!r}"
    if quant is None:
        raise ModelDirError(f"{where} has dtype {info.dtype} but config.json has no quantization_config")
    if len(shape) != 2 or not name.endswith(".weight") or name == "embed.weight":
        raise ModelDirError(f"{where} has dtype {info.dtype}; only weight matrices may be quantized "
                            "(this one must be F32, BF16 or F16)")
    out, inp = shape
    if info.dtype == "I8":
        if ".ffn.experts." not in name:
            raise ModelDirError(f"{where} is I8 (FP4); only routed experts (ffn.experts.*) may be FP4")
        if inp % FP4_GROUP:
            raise ModelDirError(f"{where}: FP4 needs the input width ({inp}) to be a multiple of {FP4_GROUP}")
        stored, grid = (out, inp // 2), (out, inp // FP4_GROUP)
    else:
        stored, grid = shape, (-(-out // FP8_BLOCK), -(-inp // FP8_BLOCK))
    if info.shape != stored:
        raise ModelDirError(f"{where} ({info.dtype}) has shape {list(info.shape)}, expected {list(stored)} "
                            "from config.json")
    sname = scale_name(name)
    scale = tensors.get(sname)
    if scale is None:
        raise ModelDirError(f"{where} ({info.dtype}) has no block scale (expected a tensor "
                            f"{info.name.removesuffix('weight')}scale or …weight_scale_inv)")
    if scale.dtype != "F8_E8M0":
        raise ModelDirError(f"{scale.file}: tensor {scale.name!r} has dtype {scale.dtype}; only F8_E8M0 "
                            "(ue8m0, power-of-two) scales are supported")
    if scale.shape != grid:
        raise ModelDirError(f"{scale.file}: tensor {scale.name!r} has shape {list(scale.shape)}, expected "
                            f"{list(grid)} for {info.dtype} weights of shape {list(shape)}")
    return sname
