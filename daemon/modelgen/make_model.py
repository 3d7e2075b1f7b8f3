"""Deterministic random-weight DeepSeek-V4 model directories (`cairn make-model`).

The directory has the shape Hugging Face publishes (config.json with HF field names,
safetensors weights in HF's save_pretrained spelling, tokenizer.json, tokenizer_config.json
with the chat template), so HF transformers loads it unchanged and serves as the oracle.
Everything is derived from (preset, seed) with numpy and the `tokenizers` trainer on text
this module synthesises itself: the same inputs give byte-identical files.

Weight scales: projections ~ N(0, 1/fan_in) so every block's output has unit-order RMS; the
hyper-connection, sink, position-bias and router-bias parameters are non-trivial so that each
code path matters for parity; lm_head is scaled so logits have a standard deviation near 1.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from .flash_slice import flash_slice_preset, write_flash_slice
from .quantize import QUANTIZATION_CONFIG, official_f32, quantize_fp4, quantize_fp8, quantized_format
from cairn.daemon.weights.safetensors_io import to_bf16_bits, write_file

# DeepSeek-V4's special tokens (daemon/protocol/encoding_dsv4.py), then padding.
SPECIAL_TOKENS = [
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<think>",
    "</think>",
    "<｜latest_reminder｜>",
    "｜DSML｜",
    "<｜pad｜>",
]
BOS, EOS = SPECIAL_TOKENS[0], SPECIAL_TOKENS[1]


def _lit(text: str) -> str:
    """A jinja string literal for `text`."""
    return json.dumps(text, ensure_ascii=False)


def v4_chat_template() -> str:
    """The V4 encoding as a jinja template, for Hugging Face's apply_chat_template (the oracle) and
    any other consumer of the directory. cairn itself serves these directories with the native encoder
    (daemon/protocol/encoding_dsv4.py): this template renders the probe conversations identically
    (daemon/protocol/chat_encoding.py), which is how cairn recognises it. What a template cannot do and the
    native encoder does: parse JSON-string tool arguments (here a string becomes one `arguments`
    parameter), sort tool results by call order, the response-format block, the 0731 effort levels."""
    from cairn.daemon.protocol import encoding_dsv4 as e

    d = e.DSML
    nl, nl2 = _lit("\n"), _lit("\n\n")
    head, tail = e._TOOLS_BLOCK.split("{schemas}")
    tools_block = (
        "{{- " + nl2 + " + " + _lit(head) + " -}}"
        "{%- for t in tools -%}{%- if not loop.first %}{{ " + nl + " }}{% endif -%}"
        "{{- (t['function'] if t['function'] is defined else t) | tojson -}}{%- endfor -%}"
        "{{- " + _lit(tail) + " -}}")
    parts = [
        "{%- if thinking is not defined or thinking is none -%}",
        "{%- set thinking = enable_thinking if enable_thinking is defined and enable_thinking is not none",
        " else false -%}{%- endif -%}",
        "{%- set ns = namespace(sys=-1, last_user=-1) -%}",
        "{%- for m in messages -%}",
        "{%- if m['role'] == 'system' and ns.sys < 0 %}{% set ns.sys = loop.index0 %}{% endif -%}",
        "{%- if m['role'] in ['user', 'tool'] %}{% set ns.last_user = loop.index0 %}{% endif -%}",
        "{%- endfor -%}",
        "{%- set drop = thinking and not tools -%}",
        "{{- bos_token -}}",
        "{%- if thinking and reasoning_effort is defined and reasoning_effort == 'max' -%}",
        "{{- " + _lit(e.EFFORT_PREAMBLES["original"]["max"]) + " -}}{%- endif -%}",
        "{%- if tools and ns.sys < 0 -%}" + tools_block + "{%- endif -%}",
        "{%- for m in messages -%}",
        "{%- set role = m['role'] -%}",
        "{%- set prev = messages[loop.index0 - 1]['role'] if loop.index0 > 0 else none -%}",
        "{%- set nxt = messages[loop.index0 + 1]['role'] if loop.index0 + 1 < messages | length else none -%}",
        "{%- if role == 'system' -%}",
        "{{- m['content'] or '' -}}",
        "{%- if tools and loop.index0 == ns.sys -%}" + tools_block + "{%- endif -%}",
        "{%- elif role in ['user', 'tool'] -%}",
        "{%- if prev in ['user', 'tool'] %}{{ " + nl2 + " }}{% else %}{{ " + _lit(e.USER) + " }}{% endif -%}",
        "{%- if role == 'tool' -%}{{- '<tool_result>' + (m['content'] or '') + '</tool_result>' -}}",
        "{%- else -%}{{- m['content'] or '' -}}{%- endif -%}",
        "{%- if nxt is none or nxt == 'assistant' -%}{{- " + _lit(e.ASSISTANT) + " -}}",
        "{%- if thinking and (not drop or loop.index0 >= ns.last_user) %}{{ '<think>' }}{% else %}{{ '</think>' }}",
        "{% endif -%}{%- endif -%}",
        "{%- elif role == 'assistant' -%}",
        "{%- if thinking and (not drop or loop.index0 > ns.last_user) -%}",
        "{{- (m['reasoning_content'] if m['reasoning_content'] is string else (m['reasoning'] or ''))"
        " + '</think>' -}}",
        "{%- endif -%}",
        "{{- m['content'] or '' -}}",
        "{%- if m['tool_calls'] -%}",
        "{{- " + _lit(f"\n\n<{d}tool_calls>\n") + " -}}",
        "{%- for c in m['tool_calls'] -%}",
        "{%- if not loop.first %}{{ " + nl + " }}{% endif -%}",
        "{{- " + _lit(f'<{d}invoke name="') + " + c['function']['name'] + " + _lit('">\n') + " -}}",
        "{%- set args = c['function']['arguments'] -%}",
        "{%- if args is string %}{% set args = {'arguments': args} %}{% endif -%}",
        "{%- for k, v in args.items() -%}",
        "{%- if not loop.first %}{{ " + nl + " }}{% endif -%}",
        "{{- " + _lit(f'<{d}parameter name="') + " + k + " + _lit('" string="') + " + ('true' if v is string"
        " else 'false') + " + _lit('">') + " + (v if v is string else v | tojson) + "
        + _lit(f"</{d}parameter>") + " -}}",
        "{%- endfor -%}",
        "{{- " + _lit(f"\n</{d}invoke>") + " -}}",
        "{%- endfor -%}",
        "{{- " + _lit(f"\n</{d}tool_calls>") + " -}}",
        "{%- endif -%}",
        "{{- eos_token -}}",
        "{%- else -%}{{- raise_exception('unknown message role: ' + role) -}}",
        "{%- endif -%}",
        "{%- endfor -%}",
    ]
    return "".join(parts)


@dataclass(frozen=True)
class Preset:
    """Architecture hyper-parameters in HF config field names."""

    vocab_size: int
    hidden_size: int
    layer_types: tuple[str, ...]
    mlp_layer_types: tuple[str, ...]
    num_attention_heads: int
    head_dim: int
    qk_rope_head_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    sliding_window: int
    csa_rate: int
    hca_rate: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    n_routed_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    hc_mult: int = 4
    swiglu_limit: float = 10.0
    max_position_embeddings: int = 65536
    extra: dict = field(default_factory=dict)
    # The official DeepSeek-V4 quantization: None (float weights), or the routed experts' format
    # ("fp4" as V4-Flash, "fp8" as V4-Flash-Base) with every other projection FP8 (quantize.py).
    quant: str | None = None
    # DSpark drafter blocks written under `mtp.{i}.` in shards of their own, as V4-Flash-0731 ships
    # them (flash_slice.py); cairn ignores them (daemon/weights/model_dir.py canonical_name).
    drafter_blocks: int = 0


S, C, H = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"

PRESETS: dict[str, Preset] = {
    # For tests: every layer kind and router kind, tiny widths, boundaries crossed by 300 tokens.
    "tiny": Preset(
        vocab_size=512, hidden_size=64, layer_types=(S, C, H, C, H), mlp_layer_types=("hash_moe",) * 2 + ("moe",) * 3,
        num_attention_heads=4, head_dim=32, qk_rope_head_dim=8, q_lora_rank=32, o_groups=2, o_lora_rank=16,
        sliding_window=16, csa_rate=4, hca_rate=16, index_n_heads=16, index_head_dim=16, index_topk=8,
        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
    ),
    # For benchmarks and the demo: V4 proportions scaled down (~0.2 B parameters).
    "small": Preset(
        vocab_size=8192, hidden_size=1024, layer_types=(S, S, C, H, C, H, C, H),
        mlp_layer_types=("hash_moe",) * 3 + ("moe",) * 5,
        num_attention_heads=16, head_dim=128, qk_rope_head_dim=64, q_lora_rank=256, o_groups=4, o_lora_rank=256,
        sliding_window=128, csa_rate=4, hca_rate=128, index_n_heads=16, index_head_dim=64, index_topk=64,
        n_routed_experts=16, num_experts_per_tok=4, moe_intermediate_size=512,
    ),
}


_TINY_Q = dict(
    vocab_size=512, hidden_size=256, layer_types=(S, C, H), mlp_layer_types=("hash_moe", "moe", "moe"),
    num_attention_heads=4, head_dim=64, qk_rope_head_dim=16, q_lora_rank=128, o_groups=2, o_lora_rank=64,
    sliding_window=16, csa_rate=4, hca_rate=16, index_n_heads=16, index_head_dim=32, index_topk=8,
    n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
)
# For tests of the quantized format: every quantized dimension is <= 128 or a multiple of it (HF
# derives the block size from the scale grid), several 128x128 blocks per matrix.
PRESETS["tiny-fp4"] = Preset(**_TINY_Q, quant="fp4")
PRESETS["tiny-fp8"] = Preset(**_TINY_Q, quant="fp8")
# DeepSeek-V4-Flash as released (43 layers; `layers=` cuts it), written by flash_slice.py.
PRESETS["flash-slice"] = Preset(
    vocab_size=129280, hidden_size=4096, layer_types=(S, S) + (C, H) * 20 + (C,),
    mlp_layer_types=("hash_moe",) * 3 + ("moe",) * 40,
    num_attention_heads=64, head_dim=512, qk_rope_head_dim=64, q_lora_rank=1024, o_groups=8, o_lora_rank=1024,
    sliding_window=128, csa_rate=4, hca_rate=128, index_n_heads=64, index_head_dim=128, index_topk=512,
    n_routed_experts=256, num_experts_per_tok=6, moe_intermediate_size=2048, max_position_embeddings=1048576,
    quant="fp4",
)


# For paged-expert tests and benches (issue 12): the official FP4 format with routed experts ~95 % of
# the ~110 MB of weights (4 layers x 64 experts x 418 KiB), written like flash-slice (codes drawn
# directly: seconds, little memory).
PRESETS["experts-fp4"] = Preset(
    vocab_size=512, hidden_size=512, layer_types=(S, C, H, C), mlp_layer_types=("hash_moe",) + ("moe",) * 3,
    num_attention_heads=8, head_dim=128, qk_rope_head_dim=64, q_lora_rank=256, o_groups=2, o_lora_rank=256,
    sliding_window=128, csa_rate=4, hca_rate=128, index_n_heads=8, index_head_dim=64, index_topk=64,
    n_routed_experts=64, num_experts_per_tok=6, moe_intermediate_size=512, max_position_embeddings=65536,
    quant="fp4",
)
# For memory-limit tests (issue 20): a tiny model whose live state grows fast (~3.3 KiB per token:
# one wide head, compression rate 2), so a few thousand tokens fill tens of MB under a cgroup limit.
PRESETS["tiny-wide-state"] = Preset(
    vocab_size=512, hidden_size=64, layer_types=(S,) + (C,) * 6, mlp_layer_types=("hash_moe",) + ("moe",) * 6,
    num_attention_heads=1, head_dim=256, qk_rope_head_dim=16, q_lora_rank=32, o_groups=1, o_lora_rank=16,
    sliding_window=16, csa_rate=2, hca_rate=16, index_n_heads=1, index_head_dim=16, index_topk=8,
    n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
)
# V4-Flash-0731's structure at toy width (loader and start-up tests, issue 20): all 43 layers, 256
# experts top-6, the first three hash-routed, official names, FP8/FP4 layout, 48 shards (embedding,
# one per layer, head, three DSpark drafter blocks) and an index: ~70,000 tensors in ~40 MB.
PRESETS["flash-shape"] = replace(
    PRESETS["flash-slice"], vocab_size=512, hidden_size=64, num_attention_heads=2, head_dim=32,
    qk_rope_head_dim=8, q_lora_rank=32, o_groups=2, o_lora_rank=16, sliding_window=16, hca_rate=16,
    index_n_heads=4, index_head_dim=16, index_topk=8, moe_intermediate_size=32,
    max_position_embeddings=65536, drafter_blocks=3, extra={"dspark_block_size": 5})
# For GGUF fixtures (tests/fixtures/gguf/, scripts/make_gguf_fixtures.py): the tiny model inside the
# limits llama.cpp's DeepSeek-V4 loader hard-codes (compression rates 4 and 128, hc_mult 4, indexer head
# dim >= 64), so its converter writes it as it writes V4-Flash. ~1.3 MB of F32 weights. 16 indexer heads:
# with 2 or 4 the kernel and HF part from the first top-k selection (~40 tokens; not yet explained).
PRESETS["gguf-tiny"] = Preset(
    vocab_size=512, hidden_size=64, layer_types=(S, C, H), mlp_layer_types=("hash_moe", "moe", "moe"),
    num_attention_heads=2, head_dim=64, qk_rope_head_dim=16, q_lora_rank=32, o_groups=2, o_lora_rank=16,
    sliding_window=16, csa_rate=4, hca_rate=128, index_n_heads=16, index_head_dim=64, index_topk=8,
    n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
)
# For the quantized GGUF fixtures (issue 23; llama-quantize on its F32 conversion): gguf-tiny's limits,
# and every matrix's input width (hidden, q_lora_rank, heads x head_dim / o_groups, o_groups x
# o_lora_rank, moe_intermediate_size, hc_mult x hidden) a multiple of 256, the K-quants' block, at the
# fewest weights that allows (~1.5 M): one CSA layer (the matrix kinds of every layer kind), two
# experts top-1 (routing still picks), vocabulary 320. 16 indexer heads, as gguf-tiny.
PRESETS["gguf-quant"] = Preset(
    vocab_size=320, hidden_size=256, layer_types=(C,), mlp_layer_types=("moe",),
    num_attention_heads=2, head_dim=128, qk_rope_head_dim=16, q_lora_rank=256, o_groups=1, o_lora_rank=256,
    sliding_window=16, csa_rate=4, hca_rate=128, index_n_heads=16, index_head_dim=64, index_topk=8,
    n_routed_experts=2, num_experts_per_tok=1, moe_intermediate_size=256,
)
# For decode at depth (issue 41, bench/depth.py): V4-Flash's attention, compressor and indexer widths
# in fp32, as V4-Flash's layers 2-3 (CSA then HCA, hash-routed first), with 16 small experts and a
# 1,024-token vocabulary (~0.3 B parameters, 1.3 GB): the work that grows with the context is V4-Flash's
# per layer, and a 128k state builds in about 15 min on 2 cores (~6e13 multiply-adds). Inside
# llama.cpp's loader limits, so the same directory converts to an F32 GGUF for the side-by-side runs.
PRESETS["flash-attn"] = replace(
    PRESETS["flash-slice"], vocab_size=1024, layer_types=(C, H), mlp_layer_types=("hash_moe", "moe"),
    n_routed_experts=16, num_experts_per_tok=6, moe_intermediate_size=128, quant=None)
DIRECT_CODES = ("flash-slice", "experts-fp4", "flash-shape")   # written by flash_slice.write_flash_slice


def hf_config(p: Preset) -> dict:
    n = len(p.layer_types)
    cfg = {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": p.vocab_size,
        "hidden_size": p.hidden_size,
        "num_hidden_layers": n,
        "num_attention_heads": p.num_attention_heads,
        "num_key_value_heads": 1,
        "head_dim": p.head_dim,
        "partial_rotary_factor": p.qk_rope_head_dim / p.head_dim,
        "q_lora_rank": p.q_lora_rank,
        "o_groups": p.o_groups,
        "o_lora_rank": p.o_lora_rank,
        "sliding_window": p.sliding_window,
        "layer_types": list(p.layer_types),
        "mlp_layer_types": list(p.mlp_layer_types),
        "compress_rates": {C: p.csa_rate, H: p.hca_rate},
        "rope_theta": 10000.0,
        "compress_rope_theta": 160000.0,
        "rope_parameters": {
            "main": {"rope_type": "default", "rope_theta": 10000.0,
                     "partial_rotary_factor": p.qk_rope_head_dim / p.head_dim},
            "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "factor": 16.0,
                         "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1,
                         "attention_factor": 1.0, "partial_rotary_factor": p.qk_rope_head_dim / p.head_dim},
        },
        "hc_mult": p.hc_mult,
        "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6,
        "rms_norm_eps": 1e-6,
        "n_routed_experts": p.n_routed_experts,
        "n_shared_experts": 1,
        "num_experts_per_tok": p.num_experts_per_tok,
        "moe_intermediate_size": p.moe_intermediate_size,
        "routed_scaling_factor": 1.5,
        "scoring_func": "sqrtsoftplus",
        "norm_topk_prob": True,
        "swiglu_limit": p.swiglu_limit,
        "index_n_heads": p.index_n_heads,
        "index_head_dim": p.index_head_dim,
        "index_topk": p.index_topk,
        "num_nextn_predict_layers": 0,
        "max_position_embeddings": p.max_position_embeddings,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "tie_word_embeddings": False,
        "dtype": "float32",
    }
    if p.quant:
        cfg["expert_dtype"] = p.quant  # top level, as in the official config.json
        cfg["quantization_config"] = dict(QUANTIZATION_CONFIG)
    cfg.update(p.extra)
    return cfg


def make_weights(p: Preset, seed: int) -> dict[str, np.ndarray]:
    """Random weights in HF's save_pretrained spelling (fp32; int64 for tid2eid)."""
    rng = np.random.default_rng(seed)
    D, N, V = p.hidden_size, p.hc_mult, p.vocab_size
    H_, Dh, I, E = p.num_attention_heads, p.head_dim, p.moe_intermediate_size, p.n_routed_experts
    w: dict[str, np.ndarray] = {}

    def lin(name: str, out_f: int, in_f: int, gain: float = 1.0) -> None:
        w[name] = (rng.standard_normal((out_f, in_f), dtype=np.float32) * np.float32(gain / np.sqrt(in_f)))

    def vec(name: str, shape, mean: float, std: float) -> None:
        w[name] = (mean + std * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)

    vec("model.embed_tokens.weight", (V, D), 0.0, 1.0)
    for i, kind in enumerate(p.layer_types):
        L = f"model.layers.{i}."
        A = L + "attn."
        vec(L + "attn_norm.weight", (D,), 1.0, 0.1)
        vec(L + "ffn_norm.weight", (D,), 1.0, 0.1)
        for blk in ("attn", "ffn"):
            vec(f"{L}hc_{blk}_fn", ((2 + N) * N, N * D), 0.0, 1.0 / np.sqrt(N * D))
            vec(f"{L}hc_{blk}_base", ((2 + N) * N,), 0.0, 0.5)
            vec(f"{L}hc_{blk}_scale", (3,), 1.0, 0.2)
        lin(A + "wq_a.weight", p.q_lora_rank, D)
        vec(A + "q_norm.weight", (p.q_lora_rank,), 1.0, 0.1)
        lin(A + "wq_b.weight", H_ * Dh, p.q_lora_rank)
        lin(A + "wkv.weight", Dh, D)
        vec(A + "norm.weight", (Dh,), 1.0, 0.1)
        lin(A + "wo_a.weight", p.o_groups * p.o_lora_rank, H_ * Dh // p.o_groups)
        lin(A + "wo_b.weight", D, p.o_groups * p.o_lora_rank)
        vec(A + "attn_sink", (H_,), 0.0, 1.0)
        if kind != S:
            rate = p.csa_rate if kind == C else p.hca_rate
            width = 2 * Dh if kind == C else Dh
            lin(A + "compressor.wkv.weight", width, D)
            lin(A + "compressor.wgate.weight", width, D)
            vec(A + "compressor.ape", (rate, width), 0.0, 0.5)
            vec(A + "compressor.norm.weight", (Dh,), 1.0, 0.1)
        if kind == C:
            Di, nI = p.index_head_dim, p.index_n_heads
            lin(A + "indexer.compressor.wkv.weight", 2 * Di, D)
            lin(A + "indexer.compressor.wgate.weight", 2 * Di, D)
            vec(A + "indexer.compressor.ape", (p.csa_rate, 2 * Di), 0.0, 0.5)
            vec(A + "indexer.compressor.norm.weight", (Di,), 1.0, 0.1)
            lin(A + "indexer.wq_b.weight", nI * Di, p.q_lora_rank)
            lin(A + "indexer.weights_proj.weight", nI, D)
        F = L + "ffn."
        lin(F + "gate.weight", E, D)
        if p.mlp_layer_types[i] == "hash_moe":
            k = p.num_experts_per_tok
            w[F + "gate.tid2eid"] = np.argsort(rng.random((V, E)), axis=1)[:, :k].astype(np.int64)
        else:
            vec(F + "gate.bias", (E,), 0.0, 0.1)
        for e in range(E):
            lin(f"{F}experts.{e}.w1.weight", I, D)
            lin(f"{F}experts.{e}.w2.weight", D, I)
            lin(f"{F}experts.{e}.w3.weight", I, D)
        lin(F + "shared_experts.w1.weight", I, D)
        lin(F + "shared_experts.w2.weight", D, I)
        lin(F + "shared_experts.w3.weight", I, D)
    vec("model.norm.weight", (D,), 1.0, 0.1)
    vec("model.hc_head.hc_fn", (N, N * D), 0.0, 1.0 / np.sqrt(N * D))
    vec("model.hc_head.hc_base", (N,), 0.0, 0.5)
    vec("model.hc_head.hc_scale", (1,), 1.0, 0.2)
    lin("head.weight", V, D, gain=1.0)
    return w


# ---------------------------------------------------------------------------------------------
# Tokenizer: byte-level BPE trained on text synthesised here from a fixed seed.

_WORDS = (
    "the of and to in is that for it as with was on be by this are from or an at which not have "
    "can all one has more when will also its would about they there their what into if so out "
    "up use time only new some could these two may first any then do like other than most such "
    "model token prompt state cache window layer prefix request answer turn agent system user "
    "assistant tool function call result error file path read write socket daemon server client "
    "checkpoint restore snapshot chunk segment cancel retry queue admit decode prefill compute "
    "def return class import self none true false print value list dict string number index "
    "def main args config value key data line text code test run build make install service"
).split()
_SYLLABLES = (
    "ka ri to mo na shi be lu ve da zo pe qui tra len mor gan fel dis pro con ver sta ble ment "
    "tion ing er al ic ous ive ate ize ful less ness ward wise ex in re un de pre sub inter"
).split()


def _corpus(size_words: int) -> list[str]:
    rng = np.random.default_rng(20260401)
    made = {"".join(rng.choice(_SYLLABLES, size=rng.integers(1, 4))) for _ in range(6000)}
    vocab = list(_WORDS) + sorted(made)
    weights = 1.0 / np.arange(1, len(vocab) + 1) ** 0.9
    weights /= weights.sum()
    lines, words = [], rng.choice(len(vocab), size=size_words, p=weights)
    punct = [".", ",", ":", "();", " =", "\n", "?", "!", " {", "}"]
    for start in range(0, size_words, 24):
        parts = [vocab[j] for j in words[start:start + 24]]
        lines.append(" ".join(parts) + punct[start // 24 % len(punct)] + " " + str(start % 997))
    return lines


def make_tokenizer(vocab_size: int, texts=None, min_frequency: int = 1, special_tokens=SPECIAL_TOKENS):
    """Byte-level BPE with V4's special tokens (or `special_tokens`; ids 0..), trained on `texts` (default:
    the synthetic corpus); scripts/train_default_model.py trains the default model's on Python source."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(special_tokens), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=min_frequency)
    if texts is None:
        texts = _corpus(200_000 if vocab_size > 1024 else 20_000)
    tok.train_from_iterator(texts, trainer=trainer)
    if tok.get_vocab_size() != vocab_size:
        # Should the synthetic text run out of merges, pad with unreachable filler tokens so the
        # tokenizer and the embedding table agree on the vocabulary size.
        tok.add_tokens([f"<｜unused{i}｜>" for i in range(vocab_size - tok.get_vocab_size())])
    return tok


def tokenizer_config(max_len: int) -> dict:
    return {
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": "<｜pad｜>",
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": max_len,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "chat_template": v4_chat_template(),
    }


# ---------------------------------------------------------------------------------------------

def make_model(preset: str | Preset, seed: int, out_dir: str | os.PathLike, *, dtype: str = "float32",
               shard_bytes: int | None = None, official_names: bool | None = None, layers: int | None = None,
               first_layer: int = 0, progress=None) -> Path:
    """Write a model directory. Returns its path. official_names: the official DeepSeek spelling
    (no `model.` prefix, scales `W.scale`) instead of HF's (`model.…`, scales `W.weight_scale_inv`);
    by default official for quantized presets (as released), HF's otherwise. layers: N layers of the
    preset, from layer first_layer (default 0; without layers, through the last), renumbered from 0
    (flash-slice: layers required; its weights are always the official layout)."""
    from . import qwen35

    if isinstance(preset, qwen35.Qwen35Preset) or (isinstance(preset, str) and preset in qwen35.PRESETS):  # issue 43
        if layers is not None or first_layer != 0 or official_names:
            raise ValueError("Qwen3.5 presets take no --layers, --first-layer or official names")
        return qwen35.make_qwen35(preset, seed, out_dir, dtype=dtype, shard_bytes=shard_bytes)
    if isinstance(preset, str) and preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join([*PRESETS, *qwen35.PRESETS])}")
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}")
    p = PRESETS[preset] if isinstance(preset, str) else preset
    flash = preset in DIRECT_CODES
    if preset == "flash-slice" and layers is None:
        raise ValueError("the flash-slice preset needs a layer count (--layers N)")
    if layers is not None or first_layer != 0:
        p = flash_slice_preset(p, layers, first_layer)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = hf_config(p)
    cfg["dtype"] = "bfloat16" if flash else dtype
    if flash:
        write_flash_slice(p, seed, out, progress)
        _write_side_files(out, p, cfg)
        return out
    weights = make_weights(p, seed)
    if official_names is None:
        official_names = p.quant is not None
    tag = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}[dtype]

    def encode(name: str, arr: np.ndarray) -> tuple[np.ndarray, str]:
        if arr.dtype == np.int64:
            return arr, "I64"
        if tag == "BF16" and not (p.quant and official_f32(name)):
            return to_bf16_bits(arr), "BF16"
        return arr.astype(np.float16 if tag == "F16" else np.float32), tag if tag != "BF16" else "F32"

    encoded: dict[str, tuple[np.ndarray, str]] = {}
    for name, arr in weights.items():
        fmt = quantized_format(name, p.quant)
        if fmt is None:
            encoded[name] = encode(name, arr)
        else:
            codes, scales = quantize_fp4(arr) if fmt == "fp4" else quantize_fp8(arr)
            encoded[name] = (codes, "I8" if fmt == "fp4" else "F8_E4M3")
            encoded[name.removesuffix("weight") + ("scale" if official_names else "weight_scale_inv")] = \
                (scales, "F8_E8M0")
    if official_names:
        encoded = {to_official_name(k): v for k, v in encoded.items()}
    _write_weights(out, encoded, shard_bytes)
    _write_side_files(out, p, cfg)
    return out


def _write_side_files(out: Path, p: Preset, cfg: dict) -> None:
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    tok = make_tokenizer(p.vocab_size)
    (out / "tokenizer.json").write_text(tok.to_str(pretty=True) + "\n")
    (out / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(p.max_position_embeddings), indent=2, ensure_ascii=False, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 0, "eos_token_id": 1}, indent=2, sort_keys=True) + "\n")


def _write_weights(out: Path, encoded: dict[str, tuple[np.ndarray, str]], shard_bytes: int | None) -> None:
    for stale in out.glob("model*.safetensors*"):
        stale.unlink()
    if not shard_bytes:
        write_file(out / "model.safetensors", encoded)
        return
    shards: list[dict] = [{}]
    size = 0
    for name in sorted(encoded):
        nbytes = encoded[name][0].nbytes
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = encoded[name]
        size += nbytes
    weight_map = {}
    total = 0
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        write_file(out / fname, shard)
        for name, (arr, _) in shard.items():
            weight_map[name] = fname
            total += arr.nbytes
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def to_official_name(hf_name: str) -> str:
    """HF save_pretrained spelling -> the official DeepSeek checkpoint spelling."""
    special = {
        "model.embed_tokens.weight": "embed.weight",
        "model.norm.weight": "norm.weight",
        "model.hc_head.hc_fn": "hc_head_fn",
        "model.hc_head.hc_base": "hc_head_base",
        "model.hc_head.hc_scale": "hc_head_scale",
    }
    if hf_name in special:
        return special[hf_name]
    name = hf_name.removeprefix("model.")
    return name.replace(".attn.norm.weight", ".attn.kv_norm.weight")


def preset_with(name: str, **changes) -> Preset:
    """A preset with some fields replaced (tests build variants this way)."""
    return replace(PRESETS[name], **changes)
