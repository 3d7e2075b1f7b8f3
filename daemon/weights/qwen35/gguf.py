"""Qwen3.5 in GGUF as llama.cpp's converter writes it (arch `qwen35` dense, `qwen35moe`;
`Qwen3_5TextModel` / `Qwen3_5MoeTextModel` in its conversion/qwen.py): the metadata mapped to the HF
config.json fields resolve_config reads, the tensor names mapped to the canonical ones, and the value
transforms the converter applies undone (docs/model-format.md, "Qwen3.5", GGUF).

What the converter changes, and how the kernel gets the model back (kernel_inputs.kernel_weights):
 * every RMSNorm weight except the GDN output norm (`ssm_norm`) is stored folded, `1 + w` in fp32 (HF's
   own fold): handed to the kernel as stored, under `<name>+1`.
 * `ssm_a = -exp(A_log)` in fp32 (what HF computes): handed as stored, under `linear_attn.ssm_a`.
 * the short convolution is squeezed to [conv_dim, K] (the same bytes as HF's [conv_dim, 1, K]); a
   quantized file's `ffn_gate_inp_shexp` is a vector (the same bytes as [1, D]).
 * when nk != nv the V heads are reordered from grouped (by k head) to tiled
   (`_LinearAttentionVReorderBase`): the v rows of attn_qkv, the rows of attn_gate, ssm_alpha,
   ssm_beta, ssm_a, ssm_dt, the v channels of ssm_conv1d and the columns of ssm_out. `untile` puts
   rows back (a block format's rows too: a row is whole blocks); a block-format ssm_out cannot be
   (its blocks run along the columns), so the kernel writes its input in the tiled order instead
   (`out_proj.weight:tiled`).
"""

from __future__ import annotations

import re

import numpy as np

from ..errors import ModelDirError
from ..gguf_metadata import metadata_key
from .config import FULL, LIN

ARCHS = ("qwen35", "qwen35moe")
_TOP = {"token_embd.weight": "embed_tokens.weight", "output_norm.weight": "norm.weight",
        "output.weight": "lm_head.weight"}
_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "attn_qkv.weight": "linear_attn.in_proj_qkv.weight",
    "attn_gate.weight": "linear_attn.in_proj_z.weight",
    "ssm_conv1d.weight": "linear_attn.conv1d.weight",
    "ssm_dt.bias": "linear_attn.dt_bias",
    "ssm_a": "linear_attn.A_log",                       # stored as -exp(A_log)
    "ssm_beta.weight": "linear_attn.in_proj_b.weight",
    "ssm_alpha.weight": "linear_attn.in_proj_a.weight",
    "ssm_norm.weight": "linear_attn.norm.weight",
    "ssm_out.weight": "linear_attn.out_proj.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# stacked routed experts [E, out, in] -> per expert `mlp.experts.{e}.{part}_proj.weight`
_EXPERTS = {"ffn_gate_exps.weight": "gate", "ffn_up_exps.weight": "up", "ffn_down_exps.weight": "down"}
_CANON_TO_GGUF = {v: k for k, v in _TOP.items()}
_FOLDED_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_norm.weight",
                 "self_attn.k_norm.weight")


def gguf_name(canonical: str) -> str:
    """Canonical name -> llama.cpp's (for messages)."""
    if canonical in _CANON_TO_GGUF:
        return _CANON_TO_GGUF[canonical]
    m = re.match(r"layers\.(\d+)\.(.+)$", canonical)
    if m:
        rest = m.group(2)
        e = re.match(r"mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$", rest)
        if e:
            return f"blk.{m.group(1)}.ffn_{e.group(2)}_exps.weight (expert {e.group(1)})"
        for k, v in _LAYER.items():
            if v == rest:
                return f"blk.{m.group(1)}.{k}"
    return canonical


def tensor_name(name: str, n_layers: int) -> tuple[str, str | None, int | None]:
    """llama.cpp's name -> (kind, canonical name or expert part, layer), as dsv4/gguf.tensor_name:
    "tensor", "experts" (a stacked [E, out, in] tensor; part "gate"|"up"|"down", or "gate_up" for
    llama.cpp's fused [E, 2I, D]), "ignored" (the MTP block past the last layer), "skip" (not ours)."""
    if name in _TOP:
        return "tensor", _TOP[name], None
    m = re.match(r"blk\.(\d+)\.(.+)$", name)
    if m is None:
        return "skip", None, None
    layer, rest = int(m.group(1)), m.group(2)
    if layer >= n_layers:
        return "ignored", None, None
    if rest in _LAYER:
        return "tensor", f"layers.{layer}.{_LAYER[rest]}", None
    if rest in _EXPERTS:
        return "experts", _EXPERTS[rest], layer
    if rest == "ffn_gate_up_exps.weight":
        return "experts", "gate_up", layer
    return "skip", None, None


def expert_views(cfg: dict, layer: int, part: str) -> tuple[tuple[int, int, int], list[str]]:
    """A stacked expert tensor's expected shape [E, out, in] and each expert's canonical name (part
    "gate_up": each expert's [2I, D] block holds its gate rows, then its up rows; the caller splits)."""
    E, I, D = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["hidden_size"]
    if part == "gate_up":
        return (E, 2 * I, D), [f"layers.{layer}.mlp.experts.{e}.gate_up" for e in range(E)]
    want = (E, D, I) if part == "down" else (E, I, D)
    return want, [f"layers.{layer}.mlp.experts.{e}.{part}_proj.weight" for e in range(E)]


def config_from_metadata(meta: dict, where: str, *, tied: bool | None = None) -> dict:
    """qwen35(moe).* metadata -> the HF config.json fields resolve_config reads. `tied`: whether the
    file lacks output.weight (llama.cpp writes no head for tied embeddings); metadata does not say."""
    arch = meta.get("general.architecture")
    if arch not in ARCHS:
        raise ModelDirError(f"{where}: general.architecture is {arch!r}; Qwen3.5 GGUF files are {' or '.join(ARCHS)}")

    key = metadata_key(meta, where, arch)
    num = (int, float)
    n = key("block_count") - key("nextn_predict_layers", default=0)
    recurrent = meta.get(f"{arch}.attention.recurrent_layers")
    if recurrent is not None:
        if not isinstance(recurrent, list) or len(recurrent) < n:
            raise ModelDirError(f"{where}: {arch}.attention.recurrent_layers must list {n} booleans, got {recurrent!r}")
        types = [LIN if r else FULL for r in recurrent[:n]]
    else:
        every = key("full_attention_interval")
        types = [FULL if (i + 1) % every == 0 else LIN for i in range(n)]
    head_dim, state, nv = key("attention.key_length"), key("ssm.state_size"), key("ssm.time_step_rank")
    inner = key("ssm.inner_size")
    if inner % nv:
        raise ModelDirError(f"{where}: {arch}.ssm.inner_size ({inner}) is not a multiple of ssm.time_step_rank ({nv})")
    vocab = len(meta.get("tokenizer.ggml.tokens") or []) or key("vocab_size")
    raw = {
        "model_type": "qwen3_5_moe_text" if arch == "qwen35moe" else "qwen3_5_text",
        "vocab_size": vocab,
        "hidden_size": key("embedding_length"),
        "num_hidden_layers": n,
        "layer_types": types,
        "num_attention_heads": key("attention.head_count"),
        "num_key_value_heads": key("attention.head_count_kv"),
        "head_dim": head_dim,
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon", num),
        "rope_theta": key("rope.freq_base", num),
        "partial_rotary_factor": key("rope.dimension_count") / head_dim,
        "linear_conv_kernel_dim": key("ssm.conv_kernel"),
        "linear_key_head_dim": state,
        "linear_value_head_dim": inner // nv,
        "linear_num_key_heads": key("ssm.group_count"),
        "linear_num_value_heads": nv,
        "max_position_embeddings": key("context_length"),
        "tie_word_embeddings": bool(tied),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
    }
    if arch == "qwen35moe":
        raw |= {"num_experts": key("expert_count"), "num_experts_per_tok": key("expert_used_count"),
                "moe_intermediate_size": key("expert_feed_forward_length"),
                "shared_expert_intermediate_size": key("expert_shared_feed_forward_length")}
    else:
        raw["intermediate_size"] = key("feed_forward_length")
    return raw


# --------------------------------------------------------------------------------------------
# values: the converter's transforms undone

def untile_perm(cfg: dict, head_dim: int) -> np.ndarray | None:
    """Index array p with grouped[i] = tiled[p[i]] along a v-head axis of nv * head_dim entries;
    None when nk == nv (no reorder). Grouped: [k0v0, k0v1, .., k1v0, ..]; tiled: [k0v0, k1v0, .., k0v1, ..]."""
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    if nk == nv:
        return None
    r = nv // nk
    tiled = np.arange(nv * head_dim).reshape(r, nk, head_dim)   # position in the file, by (j, g, d)
    return tiled.transpose(1, 0, 2).reshape(-1)                   # read in grouped (g, j, d) order


def untile(canonical: str, a: np.ndarray, cfg: dict) -> np.ndarray:
    """A GDN tensor in the file's tiled v-head order -> HF's grouped order (a copy; others as given)."""
    if ".linear_attn." not in canonical:
        return a
    part = canonical.rsplit(".linear_attn.", 1)[1]
    dv = cfg["linear_value_head_dim"]
    qk = 2 * cfg["linear_num_key_heads"] * cfg["linear_key_head_dim"]
    if part in ("in_proj_qkv.weight", "conv1d.weight"):
        p = untile_perm(cfg, dv)
        return a if p is None else np.concatenate([a[:qk], a[qk:][p]])
    if part == "in_proj_z.weight":
        p = untile_perm(cfg, dv)
        return a if p is None else a[p]
    if part in ("in_proj_a.weight", "in_proj_b.weight", "A_log", "dt_bias"):
        p = untile_perm(cfg, 1)
        return a if p is None else a[p]
    if part == "out_proj.weight":
        p = untile_perm(cfg, dv)
        return a if p is None else np.ascontiguousarray(a[:, p])
    return a


def is_folded_norm(canonical: str) -> bool:
    """A norm weight llama.cpp stores as 1 + w (every RMSNorm but the GDN output norm)."""
    return canonical == "norm.weight" or canonical.endswith(_FOLDED_NORMS)
