"""Oracle bridge for the native kernel tests (imported by conftest.py and test subprocesses).

Builds small HF `DeepseekV4ForCausalLM` models with re-randomised weights (sinks, position
biases, router bias, tid2eid, hyper-connection params all non-trivial; logits std ~ 1), renames
their state_dict to the canonical DeepSeek names, and hands them to `cairn._kernel.Model`.
HF results (full no-cache forward, cached greedy decode) are computed once per session.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

# The oracle is part of the test suite, not optional: without it the parity tests would not run, so
# a missing torch/transformers is an error (never a skip) that says how to install them.
try:
    import torch
    import transformers
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
except ImportError as e:
    raise ImportError(
        f"the HF oracle needs torch and transformers ({e}); `make test` installs them, or run "
        "`.venv/bin/pip install -e '.[oracle]'`") from e

import cairn._kernel as K  # noqa: E402

PROMPT_LEN = 320
N_DECODE = 64

# name -> (DeepseekV4Config kwargs, seed)
CONFIGS: dict[str, dict] = {
    # W=16, HCA rate 16, YaRN compress rope, 4 HC streams
    "w16-hca16": dict(
        vocab_size=512, hidden_size=128, moe_intermediate_size=64, num_hidden_layers=6,
        num_attention_heads=4, head_dim=64, q_lora_rank=64, partial_rotary_factor=16 / 64,
        num_experts_per_tok=2, n_routed_experts=8, sliding_window=16, o_groups=2, o_lora_rank=32,
        layer_types=["sliding_attention", "sliding_attention", "compressed_sparse_attention",
                     "heavily_compressed_attention", "compressed_sparse_attention",
                     "heavily_compressed_attention"],
        mlp_layer_types=["hash_moe"] * 3 + ["moe"] * 3,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
        index_n_heads=16, index_head_dim=32, index_topk=8,
        rope_parameters={"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536,
                         "beta_fast": 32, "beta_slow": 1},
    ),
    # W=32, HCA rate 128 (2-3 entries over the prompt), top-k 16
    "w32-hca128": dict(
        vocab_size=512, hidden_size=128, moe_intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, head_dim=64, q_lora_rank=64, partial_rotary_factor=16 / 64,
        num_experts_per_tok=2, n_routed_experts=8, sliding_window=32, o_groups=2, o_lora_rank=32,
        layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                     "compressed_sparse_attention"],
        mlp_layer_types=["hash_moe"] + ["moe"] * 3,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
        index_n_heads=16, index_head_dim=32, index_topk=16,
        rope_parameters={"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536,
                         "beta_fast": 32, "beta_slow": 1},
    ),
    # tight SwiGLU clamp, 2 HC streams, k=1, top-k 2, plain (non-YaRN) compress rope
    "clamp-n2": dict(
        vocab_size=384, hidden_size=96, moe_intermediate_size=48, num_hidden_layers=4,
        num_attention_heads=2, head_dim=48, q_lora_rank=48, partial_rotary_factor=16 / 48,
        num_experts_per_tok=1, n_routed_experts=4, sliding_window=16, o_groups=2, o_lora_rank=24,
        hc_mult=2, swiglu_limit=0.5,
        layer_types=["heavily_compressed_attention", "compressed_sparse_attention", "sliding_attention",
                     "compressed_sparse_attention"],
        mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 32},
        index_n_heads=16, index_head_dim=16, index_topk=2,
    ),
}


# Long context: CSA rate 4 and HCA rate 128 at 4096+ tokens (over 1000 CSA entries for the indexer to
# choose 16 from, 32 HCA rows), a 16-token window, hidden size 64: cheap enough for HF's full no-cache
# forward in CI. 16 indexer heads, as above: with only a few, whole rows of scores are exactly zero
# (every head's ReLU at 0) and ties at the top-k boundary become common; HF breaks them arbitrarily
# (torch.topk) and the kernel by lowest index, so the two would select different entries.
LONG_NAME = "long-csa4-hca128"
LONG_LEN = 4096 + 64
LONG_TAIL = 64
LONG_CONFIG = dict(
    vocab_size=256, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=3,
    num_attention_heads=2, head_dim=32, q_lora_rank=32, partial_rotary_factor=8 / 32,
    num_experts_per_tok=2, n_routed_experts=4, sliding_window=16, o_groups=2, o_lora_rank=16,
    layer_types=["compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"],
    mlp_layer_types=["hash_moe", "moe", "moe"],
    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
    index_n_heads=16, index_head_dim=16, index_topk=16,
    rope_parameters={"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1},
)


def resolved_config(c: DeepseekV4Config) -> dict:
    """The resolved config dict the kernel takes (what the Python loader will produce)."""
    comp = c.rope_parameters["compress"]
    return dict(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads, head_dim=c.head_dim, qk_rope_head_dim=c.qk_rope_head_dim,
        q_lora_rank=c.q_lora_rank, o_groups=c.o_groups, o_lora_rank=c.o_lora_rank, sliding_window=c.sliding_window,
        layer_types=list(c.layer_types), mlp_layer_types=list(c.mlp_layer_types),
        csa_rate=c.compress_rates["compressed_sparse_attention"],
        hca_rate=c.compress_rates["heavily_compressed_attention"],
        rope_theta=float(c.rope_theta), compress_rope_theta=float(c.compress_rope_theta),
        compress_rope_type=comp.get("rope_type", "default"), yarn_factor=float(comp.get("factor", 1.0) or 1.0),
        yarn_original_max_position_embeddings=int(comp.get("original_max_position_embeddings", 65536)),
        yarn_beta_fast=float(comp.get("beta_fast", 32)), yarn_beta_slow=float(comp.get("beta_slow", 1)),
        hc_mult=c.hc_mult, hc_sinkhorn_iters=c.hc_sinkhorn_iters, hc_eps=c.hc_eps, rms_norm_eps=c.rms_norm_eps,
        n_routed_experts=c.n_routed_experts, num_experts_per_tok=c.num_experts_per_tok,
        moe_intermediate_size=c.moe_intermediate_size, n_shared_experts=c.n_shared_experts,
        routed_scaling_factor=c.routed_scaling_factor, swiglu_limit=c.swiglu_limit,
        index_n_heads=c.index_n_heads, index_head_dim=c.index_head_dim, index_topk=c.index_topk,
        scoring_func=c.scoring_func,
    )


_ATTN = {"q_a_proj": "wq_a", "q_a_norm": "q_norm", "q_b_proj": "wq_b", "kv_proj": "wkv", "kv_norm": "kv_norm",
         "o_a_proj": "wo_a", "o_b_proj": "wo_b"}
_COMP = {"kv_proj": "wkv", "gate_proj": "wgate", "kv_norm": "norm"}


def canonical_weights(model) -> dict[str, tuple[np.ndarray, str]]:
    """HF state_dict -> canonical DeepSeek names, (array, dtype tag)."""
    out: dict[str, tuple[np.ndarray, str]] = {}

    def put(name, t):
        a = t.detach().cpu().numpy()
        tag = "I64" if a.dtype == np.int64 else "F32"
        out[name] = (np.ascontiguousarray(a), tag)

    for k, v in model.state_dict().items():
        k = k.removeprefix("model.")
        if k == "embed_tokens.weight":
            put("embed.weight", v)
        elif k == "lm_head.weight":
            put("head.weight", v)
        elif k == "norm.weight":
            put("norm.weight", v)
        elif k.startswith("hc_head."):
            put("hc_head_" + k.removeprefix("hc_head.hc_"), v)
        elif k.startswith("layers."):
            _, i, rest = k.split(".", 2)
            p = f"layers.{i}."
            parts = rest.split(".")
            if parts[0] == "input_layernorm":
                put(p + "attn_norm.weight", v)
            elif parts[0] == "post_attention_layernorm":
                put(p + "ffn_norm.weight", v)
            elif parts[0] in ("attn_hc", "ffn_hc"):
                put(p + f"hc_{parts[0][:-3]}_{parts[1]}", v)
            elif parts[0] == "self_attn":
                a = p + "attn."
                if parts[1] == "sinks":
                    put(a + "attn_sink", v)
                elif parts[1] in _ATTN:
                    put(a + _ATTN[parts[1]] + ".weight", v)
                elif parts[1] == "compressor":
                    if parts[2] == "indexer":
                        q = a + "indexer."
                        if parts[3] == "position_bias":
                            put(q + "compressor.ape", v)
                        elif parts[3] in _COMP:
                            put(q + "compressor." + _COMP[parts[3]] + ".weight", v)
                        elif parts[3] == "q_b_proj":
                            put(q + "wq_b.weight", v)
                        elif parts[3] == "scorer":
                            put(q + "weights_proj.weight", v)
                        else:
                            raise KeyError(k)
                    elif parts[2] == "position_bias":
                        put(a + "compressor.ape", v)
                    elif parts[2] in _COMP:
                        put(a + "compressor." + _COMP[parts[2]] + ".weight", v)
                    else:
                        raise KeyError(k)
                else:
                    raise KeyError(k)
            elif parts[0] == "mlp":
                f = p + "ffn."
                if parts[1] == "gate":
                    put(f + "gate." + {"weight": "weight", "tid2eid": "tid2eid",
                                       "e_score_correction_bias": "bias"}[parts[2]], v)
                elif parts[1] == "experts":
                    if parts[2] == "gate_up_proj":
                        inter = v.shape[1] // 2
                        for e in range(v.shape[0]):
                            put(f + f"experts.{e}.w1.weight", v[e, :inter])
                            put(f + f"experts.{e}.w3.weight", v[e, inter:])
                    else:
                        for e in range(v.shape[0]):
                            put(f + f"experts.{e}.w2.weight", v[e])
                elif parts[1] == "shared_experts":
                    put(f + "shared_experts." + {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}[parts[2]]
                        + ".weight", v)
                else:
                    raise KeyError(k)
            else:
                raise KeyError(k)
        else:
            raise KeyError(k)
    return out


def build_hf(cfg_kwargs: dict, seed: int):
    """Random HF model with every parameter made non-trivial."""
    torch.manual_seed(seed)
    cfg = DeepseekV4Config(**cfg_kwargs)
    model = DeepseekV4ForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)

    def rn(shape, std):
        return torch.randn(shape, generator=g) * std

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("embed_tokens.weight"):
                p.copy_(rn(p.shape, 1.0))
            elif name.endswith("lm_head.weight"):
                p.copy_(rn(p.shape, 1.0 / p.shape[1] ** 0.5))
            elif "norm" in name:
                p.copy_(1.0 + rn(p.shape, 0.1))
            elif name.endswith("sinks"):
                p.copy_(rn(p.shape, 1.0))
            elif name.endswith("position_bias"):
                p.copy_(rn(p.shape, 0.5))
            elif name.endswith((".fn", "hc_fn")):
                p.copy_(rn(p.shape, 1.0 / p.shape[1] ** 0.5))
            elif name.endswith((".base", "hc_base")):
                p.copy_(rn(p.shape, 0.5))
            elif name.endswith((".scale", "hc_scale")):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif p.ndim >= 2:
                p.copy_(rn(p.shape, 1.0 / p.shape[-1] ** 0.5))
            else:
                p.copy_(rn(p.shape, 0.1))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(rn(b.shape, 0.1))
            elif name.endswith("tid2eid"):
                E = cfg.n_routed_experts
                rows = [torch.randperm(E, generator=g)[: b.shape[1]] for _ in range(b.shape[0])]
                b.copy_(torch.stack(rows))
    return model


@dataclasses.dataclass
class Oracle:
    name: str
    hf: object
    config: dict
    weights: dict
    fingerprint: str
    tokens: np.ndarray        # int32 [PROMPT_LEN + N_DECODE]: prompt + HF greedy continuation
    ref_logits: np.ndarray    # float32 [PROMPT_LEN + N_DECODE, V], HF full no-cache forward
    greedy: np.ndarray        # int32 [N_DECODE], HF cached greedy decode

    def model(self, threads: int = 2, **kw) -> K.Model:
        return K.Model(self.config, self.weights, self.fingerprint, threads, **kw)


def model_inputs(name: str):
    """(hf model, resolved config, canonical weights, fingerprint, seed) for a named config;
    deterministic, so a subprocess can rebuild the same kernel Model."""
    seed = 1000 + list(CONFIGS).index(name)
    hf = build_hf(CONFIGS[name], seed)
    fp = hashlib.sha256(f"{name}-{seed}".encode()).hexdigest()[:16]
    return hf, resolved_config(hf.config), canonical_weights(hf), fp, seed


def _make_oracle(name: str) -> Oracle:
    hf, cfg, weights, fp, seed = model_inputs(name)
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, cfg["vocab_size"], PROMPT_LEN, dtype=np.int64)
    torch.set_num_threads(1)
    with torch.no_grad():
        ids = torch.tensor(prompt)[None]
        out = hf(input_ids=ids, use_cache=True)
        cache = out.past_key_values  # noqa
        nxt = int(out.logits[0, -1].argmax())
        greedy = [nxt]
        for _ in range(N_DECODE - 1):
            out = hf(input_ids=torch.tensor([[nxt]]), cache=cache, use_cache=True)
            cache = out.past_key_values  # noqa
            nxt = int(out.logits[0, -1].argmax())
            greedy.append(nxt)
        full = np.concatenate([prompt, np.array(greedy)]).astype(np.int64)
        ref = hf(input_ids=torch.tensor(full)[None], use_cache=False).logits[0].float().numpy()
    return Oracle(name, hf, cfg, weights, fp, full.astype(np.int32), ref.astype(np.float32),
                  np.array(greedy, dtype=np.int32))


_CACHE: dict[str, Oracle] = {}


def get_oracle(name: str) -> Oracle:
    if name not in _CACHE:
        _CACHE[name] = _make_oracle(name)
    return _CACHE[name]


@dataclasses.dataclass
class LongOracle:
    config: dict
    weights: dict
    fingerprint: str
    tokens: np.ndarray        # int32 [LONG_LEN], random
    tail_logits: np.ndarray   # float32 [LONG_TAIL, V]: HF full no-cache forward, the last positions

    def model(self, threads: int = 2) -> K.Model:
        return K.Model(self.config, self.weights, self.fingerprint, threads)


_LONG: list[LongOracle] = []


def get_long_oracle() -> LongOracle:
    if not _LONG:
        seed = 3000
        hf = build_hf(LONG_CONFIG, seed)
        tokens = np.random.default_rng(seed).integers(0, LONG_CONFIG["vocab_size"], LONG_LEN, dtype=np.int64)
        with torch.no_grad():
            out = hf(input_ids=torch.tensor(tokens)[None], use_cache=False, logits_to_keep=LONG_TAIL)
        fp = hashlib.sha256(f"{LONG_NAME}-{seed}".encode()).hexdigest()[:16]
        _LONG.append(LongOracle(resolved_config(hf.config), canonical_weights(hf), fp, tokens.astype(np.int32),
                                out.logits[0].float().numpy().astype(np.float32)))
    return _LONG[0]
