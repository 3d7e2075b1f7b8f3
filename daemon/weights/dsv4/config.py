"""DeepSeek-V4's config.json -> the flat, fully defaulted dict the kernel reads (docs/model-format.md).

The resolved dict is what the model fingerprint hashes: a key added here changes every V4 fingerprint
(tests/native/test_v4_pins.py), so the family is chosen from model_type and never stored in it.
"""

from __future__ import annotations

from ..errors import ModelDirError

SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
_LEGACY_RATIO = {0: SLIDING, 4: CSA, 128: HCA}


def resolve_config(raw: dict, where: str = "config.json") -> dict:
    """HF config.json fields -> the flat, fully defaulted dict the kernel reads."""
    if raw.get("model_type") != "deepseek_v4":
        raise ModelDirError(
            f"{where}: model_type is {raw.get('model_type')!r}; cairn serves DeepSeek-V4 models "
            "(model_type \"deepseek_v4\")")

    def get(key, default=None, kind=(int,)):
        v = raw.get(key, default)
        if v is None or isinstance(v, bool) or not isinstance(v, kind):
            raise ModelDirError(f"{where}: field {key!r} must be {' or '.join(k.__name__ for k in kind)}, got {v!r}")
        return v

    num = (int, float)
    n = get("num_hidden_layers")
    head_dim = get("head_dim", 512)
    rates = dict(raw.get("compress_rates") or {})
    csa_rate = int(rates.get(CSA, raw.get("compress_rate_csa", 4)))
    hca_rate = int(rates.get(HCA, raw.get("compress_rate_hca", 128)))
    layer_types = raw.get("layer_types")
    if layer_types is None and raw.get("compress_ratios") is not None:
        try:
            layer_types = [_LEGACY_RATIO[int(r)] for r in raw["compress_ratios"]]
        except (KeyError, ValueError):
            raise ModelDirError(f"{where}: compress_ratios entries must be 0, 4 or 128") from None
    if layer_types is None:
        layer_types = [HCA] * min(n, 2) + [CSA if i % 2 else HCA for i in range(max(n - 2, 0))]
    layer_types = list(layer_types)[:n]
    mlp = raw.get("mlp_layer_types")
    if mlp is None:
        n_hash = int(raw.get("num_hash_layers", 3))
        mlp = ["hash_moe"] * min(n, n_hash) + ["moe"] * max(0, n - n_hash)
    mlp = list(mlp)[:n]
    for name, types, allowed in (("layer_types", layer_types, (SLIDING, CSA, HCA)),
                                 ("mlp_layer_types", mlp, ("hash_moe", "moe"))):
        if len(types) != n or any(t not in allowed for t in types):
            raise ModelDirError(f"{where}: {name} must list {n} entries from {allowed}, got {types}")
    # As HF resolves it: partial_rotary_factor wins over the legacy qk_rope_head_dim.
    prf = raw.get("partial_rotary_factor")
    if prf is not None:
        rope_dim = int(head_dim * prf)
    else:
        rope_dim = int(raw.get("qk_rope_head_dim", head_dim * 64 // 512))
    # rope_parameters is either HF's nested {"main": ..., "compress": ...} or a flat (legacy
    # rope_scaling) dict that describes the compress rope only; as in HF, the flat form takes
    # its thetas from rope_theta / compress_rope_theta, never from inside the dict.
    rp = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(rp, dict):
        raise ModelDirError(f"{where}: rope_parameters must be an object, got {rp!r}")
    if isinstance(rp.get("main"), dict) and isinstance(rp.get("compress"), dict):
        main, compress = rp["main"], rp["compress"]
        main_theta = main.get("rope_theta", raw.get("rope_theta", 10000.0))
        compress_theta = compress.get("rope_theta", raw.get("compress_rope_theta", 160000.0))
    else:
        main, compress = {}, rp
        main_theta = raw.get("rope_theta", 10000.0)
        compress_theta = raw.get("compress_rope_theta", 160000.0)
    for key, theta in (("rope_theta", main_theta), ("compress_rope_theta", compress_theta)):
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
            raise ModelDirError(f"{where}: {key} must be a positive number, got {theta!r}")
    if main.get("rope_type", main.get("type", "default")) != "default":
        raise ModelDirError(f"{where}: main rope_type {main.get('rope_type', main.get('type'))!r} is not supported (default)")
    rope_type = compress.get("rope_type", compress.get("type", "default"))
    if rope_type not in ("default", "yarn"):
        raise ModelDirError(f"{where}: compress rope_type {rope_type!r} is not supported (default, yarn)")
    if rope_type == "yarn" and float(compress.get("attention_factor") or 1.0) != 1.0:
        raise ModelDirError(f"{where}: compress yarn attention_factor {compress['attention_factor']} is not "
                            "supported (DeepSeek-V4 uses 1.0: cos/sin are not scaled)")
    if raw.get("tie_word_embeddings"):
        raise ModelDirError(f"{where}: tie_word_embeddings is not supported (DeepSeek-V4 has its own head.weight)")
    if raw.get("scoring_func", "sqrtsoftplus") != "sqrtsoftplus":
        raise ModelDirError(f"{where}: scoring_func {raw.get('scoring_func')!r} is not supported (sqrtsoftplus)")
    quant = resolve_quantization(raw, where)
    cfg = {
        "vocab_size": get("vocab_size"),
        "hidden_size": get("hidden_size"),
        "num_hidden_layers": n,
        "num_attention_heads": get("num_attention_heads"),
        "head_dim": head_dim,
        "qk_rope_head_dim": rope_dim,
        "q_lora_rank": get("q_lora_rank", 1024),
        "o_groups": get("o_groups", 8),
        "o_lora_rank": get("o_lora_rank", 1024),
        "sliding_window": get("sliding_window", 128),
        "layer_types": layer_types,
        "mlp_layer_types": mlp,
        "csa_rate": csa_rate,
        "hca_rate": hca_rate,
        "rope_theta": float(main_theta),
        "compress_rope_theta": float(compress_theta),
        "compress_rope_type": rope_type,
        "yarn_factor": float(compress.get("factor", 1.0)),
        "yarn_original_max_position_embeddings": int(compress.get("original_max_position_embeddings", 65536)),
        "yarn_beta_fast": float(compress.get("beta_fast", 32)),
        "yarn_beta_slow": float(compress.get("beta_slow", 1)),
        "hc_mult": get("hc_mult", 4),
        "hc_sinkhorn_iters": get("hc_sinkhorn_iters", 20),
        "hc_eps": float(get("hc_eps", 1e-6, num)),
        "rms_norm_eps": float(get("rms_norm_eps", 1e-6, num)),
        "n_routed_experts": get("n_routed_experts", 256),
        "num_experts_per_tok": get("num_experts_per_tok", 6),
        "moe_intermediate_size": get("moe_intermediate_size", 2048),
        "n_shared_experts": get("n_shared_experts", 1),
        "routed_scaling_factor": float(get("routed_scaling_factor", 1.5, num)),
        "swiglu_limit": float(get("swiglu_limit", 10.0, num)),
        "index_n_heads": get("index_n_heads", 64),
        "index_head_dim": get("index_head_dim", 128),
        "index_topk": get("index_topk", 512),
        "scoring_func": "sqrtsoftplus",
        "max_position_embeddings": get("max_position_embeddings", 1048576),
        "bos_token_id": raw.get("bos_token_id", 0),
        "eos_token_id": raw.get("eos_token_id", 1),
    }
    if quant is not None:
        cfg["quantization"] = quant  # only then: unquantized models keep their fingerprints
    if cfg["n_shared_experts"] != 1:
        raise ModelDirError(f"{where}: n_shared_experts must be 1 (DeepSeek-V4), got {cfg['n_shared_experts']}")
    if cfg["num_attention_heads"] * head_dim % cfg["o_groups"]:
        raise ModelDirError(f"{where}: num_attention_heads*head_dim must be divisible by o_groups")
    if rope_dim % 2 or rope_dim > head_dim:
        raise ModelDirError(f"{where}: rope dim {rope_dim} must be even and at most head_dim {head_dim}")
    return cfg


def resolve_quantization(raw: dict, where: str = "config.json") -> dict | None:
    """The official DeepSeek-V4 quantization (FP8 e4m3 in 128x128 blocks with ue8m0 scales, routed
    experts FP4 or FP8) -> {"expert_dtype": ...}; None for an unquantized model; anything else is
    refused with the field that differs."""
    q = raw.get("quantization_config")
    if not q:
        return None
    if not isinstance(q, dict):
        raise ModelDirError(f"{where}: quantization_config must be an object, got {q!r}")
    want = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "activation_scheme": "dynamic"}
    for key, allowed in want.items():
        got = q.get(key, "e4m3" if key == "fmt" else None)  # HF's FineGrainedFP8Config omits fmt
        if got != allowed:
            raise ModelDirError(
                f"{where}: quantization_config.{key} is {got!r}; cairn supports the official DeepSeek-V4 "
                f"quantization only ({key} {allowed!r})")
    block = q.get("weight_block_size")
    if list(block or []) != [128, 128]:
        raise ModelDirError(f"{where}: quantization_config.weight_block_size is {block!r}; only [128, 128] "
                            "blocks are supported")
    expert = raw.get("expert_dtype", q.get("expert_dtype", "fp8"))  # top level (official) or folded in (HF)
    if expert not in ("fp8", "fp4"):
        raise ModelDirError(f"{where}: expert_dtype is {expert!r}; allowed: 'fp8', 'fp4'")
    return {"expert_dtype": expert}
