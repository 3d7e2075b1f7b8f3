"""DeepSeek-V4 in GGUF as llama.cpp writes it (arch `deepseek4`): its metadata mapped to the HF
config.json fields resolve_config reads, and its tensor names mapped one to one to the canonical ones
(gguf_dir.py reads the file; docs/model-format.md, "GGUF")."""

from __future__ import annotations

import re

from ..errors import ModelDirError
from ..gguf_metadata import metadata_key
from .config import CSA, HCA, SLIDING

ARCH = "deepseek4"
# llama.cpp tensor name -> canonical name (per layer: the part after `blk.N.` -> after `layers.N.`).
_TOP = {
    "token_embd.weight": "embed.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "head.weight",
    "output_hc_fn.weight": "hc_head_fn",
    "output_hc_base.weight": "hc_head_base",
    "output_hc_scale.weight": "hc_head_scale",
}
_LAYER = {
    "attn_norm.weight": "attn_norm.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "hc_attn_fn.weight": "hc_attn_fn",
    "hc_attn_base.weight": "hc_attn_base",
    "hc_attn_scale.weight": "hc_attn_scale",
    "hc_ffn_fn.weight": "hc_ffn_fn",
    "hc_ffn_base.weight": "hc_ffn_base",
    "hc_ffn_scale.weight": "hc_ffn_scale",
    "attn_sinks.weight": "attn.attn_sink",
    "attn_q_a.weight": "attn.wq_a.weight",
    "attn_q_a_norm.weight": "attn.q_norm.weight",
    "attn_q_b.weight": "attn.wq_b.weight",
    "attn_kv.weight": "attn.wkv.weight",
    "attn_kv_a_norm.weight": "attn.kv_norm.weight",
    "attn_output_a.weight": "attn.wo_a.weight",
    "attn_output_b.weight": "attn.wo_b.weight",
    "attn_compressor_kv.weight": "attn.compressor.wkv.weight",
    "attn_compressor_gate.weight": "attn.compressor.wgate.weight",
    "attn_compressor_ape.weight": "attn.compressor.ape",
    "attn_compressor_norm.weight": "attn.compressor.norm.weight",
    "indexer.proj.weight": "attn.indexer.weights_proj.weight",
    "indexer.attn_q_b.weight": "attn.indexer.wq_b.weight",
    "indexer_compressor_kv.weight": "attn.indexer.compressor.wkv.weight",
    "indexer_compressor_gate.weight": "attn.indexer.compressor.wgate.weight",
    "indexer_compressor_ape.weight": "attn.indexer.compressor.ape",
    "indexer_compressor_norm.weight": "attn.indexer.compressor.norm.weight",
    "ffn_gate_inp.weight": "ffn.gate.weight",
    "exp_probs_b.bias": "ffn.gate.bias",
    "ffn_gate_tid2eid.weight": "ffn.gate.tid2eid",
    "ffn_gate_shexp.weight": "ffn.shared_experts.w1.weight",
    "ffn_down_shexp.weight": "ffn.shared_experts.w2.weight",
    "ffn_up_shexp.weight": "ffn.shared_experts.w3.weight",
}
# stacked routed experts [n_expert, out, in] -> per expert `ffn.experts.{e}.{w}.weight`
_EXPERTS = {"ffn_gate_exps.weight": "w1", "ffn_down_exps.weight": "w2", "ffn_up_exps.weight": "w3"}
# written by llama.cpp, not used by cairn: the MTP block (as `mtp.*` in a directory) and the vision
# router bias of hash layers
_IGNORED_LAYER = ("nextn.", "exp_probs_b_vl.")
_CANON_TO_GGUF = {v: k for k, v in _TOP.items()}


def gguf_name(canonical: str) -> str:
    """Canonical name -> llama.cpp's (for messages)."""
    if canonical in _CANON_TO_GGUF:
        return _CANON_TO_GGUF[canonical]
    m = re.match(r"layers\.(\d+)\.(.+)$", canonical)
    if m:
        rest = m.group(2)
        e = re.match(r"ffn\.experts\.(\d+)\.(w[123])\.weight$", rest)
        if e:
            stacked = {w: k for k, w in _EXPERTS.items()}[e.group(2)]
            return f"blk.{m.group(1)}.{stacked} (expert {e.group(1)})"
        for k, v in _LAYER.items():
            if v == rest:
                return f"blk.{m.group(1)}.{k}"
    return canonical


def tensor_name(name: str, n_layers: int) -> tuple[str, str | None, int | None]:
    """llama.cpp's name -> (kind, canonical name or stacked-expert part, layer): ("tensor", canonical,
    None), ("experts", "w1"|"w2"|"w3", layer) for a stacked [n_expert, out, in] tensor, ("ignored", None,
    None) for a speculative head's block past the last layer (counted), ("skip", None, None) for a
    name that is not one of ours (a vision bias, a name llama.cpp added)."""
    if name in _TOP:
        return "tensor", _TOP[name], None
    m = re.match(r"blk\.(\d+)\.(.+)$", name)
    if m is not None and int(m.group(1)) >= n_layers:
        return "ignored", None, None
    if m is None or m.group(2).startswith(_IGNORED_LAYER):
        return "skip", None, None
    layer, rest = int(m.group(1)), m.group(2)
    if rest in _LAYER:
        return "tensor", f"layers.{layer}.{_LAYER[rest]}", None
    if rest in _EXPERTS:
        return "experts", _EXPERTS[rest], layer
    return "skip", None, None


def expert_views(cfg: dict, layer: int, w: str) -> tuple[tuple[int, int, int], list[str]]:
    """A stacked expert tensor's expected shape [n_expert, out, in] and each expert's canonical name."""
    E, I, D = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["hidden_size"]
    want = (E, D, I) if w == "w2" else (E, I, D)
    return want, [f"layers.{layer}.ffn.experts.{e}.{w}.weight" for e in range(E)]


def config_from_metadata(meta: dict, where: str) -> dict:
    """deepseek4.* metadata -> the HF config.json fields resolve_config reads."""
    arch = meta.get("general.architecture")
    if arch != ARCH:
        raise ModelDirError(f"{where}: general.architecture is {arch!r}; cairn serves DeepSeek-V4 GGUF files "
                            f"(architecture {ARCH!r}, as llama.cpp's converter writes them)")

    key = metadata_key(meta, where, ARCH)
    num = (int, float)
    n = key("block_count") - key("nextn_predict_layers", default=0)
    ratios = key("attention.compress_ratios", (list,))
    if len(ratios) < n:
        raise ModelDirError(f"{where}: {ARCH}.attention.compress_ratios has {len(ratios)} entries for {n} layers")
    kinds = {0: SLIDING, 4: CSA, 128: HCA}   # llama.cpp's: rate 4 has the indexer, 128 does not
    bad = [r for r in ratios[:n] if r not in kinds]
    if bad:
        raise ModelDirError(f"{where}: {ARCH}.attention.compress_ratios has {bad[0]}; allowed: 0, 4, 128")
    n_hash = key("hash_layer_count")
    clamp = key("swiglu_clamp_exp", (list, int, float))
    clamp = clamp if isinstance(clamp, list) else [clamp]
    if len(set(clamp[:n])) != 1:
        raise ModelDirError(f"{where}: {ARCH}.swiglu_clamp_exp differs between layers ({clamp}); cairn "
                            "takes one swiglu_limit")
    if key("expert_weights_norm", (bool,), True) is not True:
        raise ModelDirError(f"{where}: {ARCH}.expert_weights_norm is false; DeepSeek-V4 normalises the top-k "
                            "router weights")
    gating = key("expert_gating_func")
    if gating != 4:
        raise ModelDirError(f"{where}: {ARCH}.expert_gating_func is {gating}; only 4 (sqrtsoftplus) is supported")
    raw = {
        "model_type": "deepseek_v4",
        "vocab_size": len(meta.get("tokenizer.ggml.tokens") or []) or key("vocab_size"),
        "hidden_size": key("embedding_length"),
        "num_hidden_layers": n,
        "num_attention_heads": key("attention.head_count"),
        "head_dim": key("attention.key_length"),
        "qk_rope_head_dim": key("rope.dimension_count"),
        "q_lora_rank": key("attention.q_lora_rank"),
        "o_groups": key("attention.output_group_count"),
        "o_lora_rank": key("attention.output_lora_rank"),
        "sliding_window": key("attention.sliding_window"),
        "layer_types": [kinds[r] for r in ratios[:n]],
        "mlp_layer_types": ["hash_moe" if i < n_hash else "moe" for i in range(n)],
        "compress_rates": {CSA: 4, HCA: 128},
        "rope_theta": key("rope.freq_base", num),
        "compress_rope_theta": key("attention.compress_rope_freq_base", num),
        "hc_mult": key("hyper_connection.count"),
        "hc_sinkhorn_iters": key("hyper_connection.sinkhorn_iterations"),
        "hc_eps": key("hyper_connection.epsilon", num),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon", num),
        "n_routed_experts": key("expert_count"),
        "num_experts_per_tok": key("expert_used_count"),
        "moe_intermediate_size": key("expert_feed_forward_length"),
        "n_shared_experts": key("expert_shared_count"),
        "routed_scaling_factor": key("expert_weights_scale", num),
        "swiglu_limit": clamp[0],
        "index_n_heads": key("attention.indexer.head_count"),
        "index_head_dim": key("attention.indexer.key_length"),
        "index_topk": key("attention.indexer.top_k"),
        "max_position_embeddings": key("context_length"),
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id", 0),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id", 1),
    }
    scaling = meta.get(f"{ARCH}.rope.scaling.type", "none")
    if scaling == "yarn":   # the compress rope's YaRN (as the official rope_scaling); the main rope is plain
        raw["rope_scaling"] = {
            "rope_type": "yarn", "factor": key("rope.scaling.factor", num),
            "original_max_position_embeddings": key("rope.scaling.original_context_length"),
            "beta_fast": key("rope.scaling.yarn_beta_fast", num, 32.0),
            "beta_slow": key("rope.scaling.yarn_beta_slow", num, 1.0),
            "attention_factor": key("rope.scaling.yarn_attn_factor", num, 1.0)}
    elif scaling != "none":
        raise ModelDirError(f"{where}: {ARCH}.rope.scaling.type is {scaling!r}; allowed: 'yarn', 'none'")
    return raw
