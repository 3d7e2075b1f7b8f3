"""Qwen3.5's config.json (`qwen3_5`, `qwen3_5_moe` and their `*_text` configs) -> the flat, fully
defaulted dict the kernel reads (`_kernel.Qwen35Model`'s config; docs/model-format.md, "Qwen3.5").

A conditional-generation config nests the text model under `text_config` (its `tie_word_embeddings` is
the top level's): only that part is resolved, the vision config is not the text model's. The resolved
dict is fingerprinted as is, so it holds resolved values only (layer kinds listed, rope flattened),
the same for a nested and a flat config of one text model.
"""

from __future__ import annotations

from ..errors import ModelDirError

LIN, FULL = "linear_attention", "full_attention"
MODEL_TYPES = ("qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text")


def text_part(raw: dict) -> dict:
    """The text model's fields: `text_config` when nested (the top level's tie flag wins, as in HF)."""
    text = raw.get("text_config")
    if isinstance(text, dict) and text.get("model_type") in MODEL_TYPES:
        return {**text, "tie_word_embeddings": raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))}
    return raw


def resolve_config(raw: dict, where: str = "config.json") -> dict:
    """HF config.json fields (flat or nested) -> the flat dict the kernel reads."""
    t = text_part(raw)
    if t.get("model_type") not in MODEL_TYPES:
        raise ModelDirError(f"{where}: model_type is {t.get('model_type')!r}; Qwen3.5 is one of {', '.join(MODEL_TYPES)}")
    if t is not raw:
        where = f"{where} (text_config)"

    def get(key, default=None, kind=(int,)):
        v = t.get(key, default)
        if v is None or isinstance(v, bool) and bool not in kind or not isinstance(v, kind):
            raise ModelDirError(f"{where}: field {key!r} must be {' or '.join(k.__name__ for k in kind)}, got {v!r}")
        return v

    num = (int, float)
    n = get("num_hidden_layers")
    types = t.get("layer_types")
    if types is None:   # HF's default rule: every full_attention_interval-th layer is full attention
        every = get("full_attention_interval", 4)
        if every < 1:
            raise ModelDirError(f"{where}: full_attention_interval must be >= 1, got {every}")
        types = [FULL if (i + 1) % every == 0 else LIN for i in range(n)]
    types = list(types)
    if len(types) != n or any(k not in (LIN, FULL) for k in types):
        raise ModelDirError(f"{where}: layer_types must list {n} entries from ({LIN!r}, {FULL!r}), got {types}")
    if t.get("hidden_act", "silu") != "silu":
        raise ModelDirError(f"{where}: hidden_act {t['hidden_act']!r} is not supported (silu)")
    if t.get("attention_bias", False):
        raise ModelDirError(f"{where}: attention_bias true is not supported (Qwen3.5 releases have none)")
    rp = t.get("rope_parameters") or t.get("rope_scaling") or {}
    if not isinstance(rp, dict):
        raise ModelDirError(f"{where}: rope_parameters must be an object, got {rp!r}")
    if rp.get("rope_type", rp.get("type", "default")) != "default":
        raise ModelDirError(f"{where}: rope_type {rp.get('rope_type', rp.get('type'))!r} is not supported (default)")
    theta = rp.get("rope_theta", t.get("rope_theta", 10_000_000.0))
    prf = rp.get("partial_rotary_factor", t.get("partial_rotary_factor", 0.25))
    for key, v in (("rope_theta", theta), ("partial_rotary_factor", prf)):
        if isinstance(v, bool) or not isinstance(v, num) or v <= 0:
            raise ModelDirError(f"{where}: {key} must be a positive number, got {v!r}")
    H = get("num_attention_heads")
    cfg = {
        "vocab_size": get("vocab_size"),
        "hidden_size": get("hidden_size"),
        "num_hidden_layers": n,
        "layer_types": types,
        "rms_norm_eps": float(get("rms_norm_eps", 1e-6, num)),
        "tie_word_embeddings": bool(t.get("tie_word_embeddings", False)),
        "num_attention_heads": H,
        "num_key_value_heads": get("num_key_value_heads"),
        "head_dim": get("head_dim", get("hidden_size") // max(H, 1)),
        "rope_theta": float(theta),
        "partial_rotary_factor": float(prf),
        "linear_conv_kernel_dim": get("linear_conv_kernel_dim"),
        "linear_key_head_dim": get("linear_key_head_dim"),
        "linear_value_head_dim": get("linear_value_head_dim"),
        "linear_num_key_heads": get("linear_num_key_heads"),
        "linear_num_value_heads": get("linear_num_value_heads"),
        "max_position_embeddings": get("max_position_embeddings", 262144),
        "eos_token_id": t.get("eos_token_id"),
        "bos_token_id": t.get("bos_token_id"),
    }
    if (t.get("num_experts") or 0) > 0:
        cfg |= {"num_experts": get("num_experts"), "num_experts_per_tok": get("num_experts_per_tok"),
                "moe_intermediate_size": get("moe_intermediate_size"),
                "shared_expert_intermediate_size": get("shared_expert_intermediate_size")}
        if not 1 <= cfg["num_experts_per_tok"] <= cfg["num_experts"]:
            raise ModelDirError(f"{where}: num_experts_per_tok must be in 1..num_experts ({cfg['num_experts']}), "
                                f"got {cfg['num_experts_per_tok']}")
    else:
        cfg["intermediate_size"] = get("intermediate_size")
    quant = raw.get("quantization_config")
    if quant is not None:
        cfg["quantization"] = _fp8_blocks(quant, where)
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    if nk <= 0 or nv % nk:
        raise ModelDirError(f"{where}: linear_num_value_heads ({nv}) must be a multiple of linear_num_key_heads ({nk})")
    if H % max(cfg["num_key_value_heads"], 1):
        raise ModelDirError(f"{where}: num_attention_heads ({H}) must be a multiple of num_key_value_heads "
                            f"({cfg['num_key_value_heads']})")
    return cfg


FP8_BLOCKS = "fp8-e4m3-128x128"   # the resolved `quantization` of Qwen's FP8 releases


def _fp8_blocks(q, where: str) -> str:
    """quantization_config -> the one scheme cairn reads: FP8 e4m3 with a scale per 128 x 128 block."""
    if not isinstance(q, dict):
        raise ModelDirError(f"{where}: quantization_config must be an object, got {q!r}")
    wants = {"quant_method": ("fp8",), "fmt": ("e4m3", None), "weight_block_size": ([128, 128],),
             "activation_scheme": ("dynamic", None)}
    for key, allowed in wants.items():
        if q.get(key) not in allowed:
            raise ModelDirError(f"{where}: quantization_config.{key} is {q.get(key)!r}; cairn reads Qwen3.5's FP8 "
                                f"releases ({', '.join(repr(a) for a in allowed if a is not None)})")
    return FP8_BLOCKS


def is_moe(cfg: dict) -> bool:
    return cfg.get("num_experts", 0) > 0


def conv_dim(cfg: dict) -> int:
    """The GDN short convolution's channels: q | k | v."""
    return (2 * cfg["linear_num_key_heads"] * cfg["linear_key_head_dim"]
            + cfg["linear_num_value_heads"] * cfg["linear_value_head_dim"])
