"""The model-directory contract (docs/model-format.md): read, check, and hand to the kernel.

A DeepSeek-V4 directory as Hugging Face publishes one: config.json (model_type deepseek_v4),
safetensors weights (one file or shards + model.safetensors.index.json), tokenizer.json and
tokenizer_config.json carrying the chat template (or chat_template.jinja). Weights are
memory-mapped, never copied here. Both weight spellings are accepted — HF's save_pretrained
layout and the official DeepSeek one — and normalised to one canonical spelling (the official
names without a `model.` prefix). Every shape is checked against the config; each error names
the file, the tensor and what was expected. The directory is only ever read.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .safetensors_io import FileMaps, SafetensorsError, TensorInfo, read_header
from .weight_digest import DigestCache

SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
_LEGACY_RATIO = {0: SLIDING, 4: CSA, 128: HCA}


class ModelDirError(ValueError):
    """The model directory does not meet the contract; the message says what to fix."""


@dataclass(frozen=True)
class ModelDir:
    path: Path
    config: dict                      # resolved: every field the kernel reads, defaults applied
    tensors: dict[str, TensorInfo]    # canonical name -> where its bytes are
    fingerprint: str                  # config + every weight byte + tokenizer (hex sha256)
    tokenizer_file: Path
    chat_template: str | None         # None: no template shipped (the native V4 encoding is used)
    bos_token: str
    eos_token: str
    tokenizer_json: str | None = None  # a GGUF's tokenizer, built from its metadata (else: tokenizer_file)

    @property
    def name(self) -> str:
        if self.path.suffix == ".gguf":   # a GGUF file (the first of a split set): its stem, no split suffix
            from .gguf_dir import gguf_model_name

            return gguf_model_name(self.path)
        return self.path.name

    def tokenizer_text(self) -> str:
        """The tokenizer as tokenizer.json text."""
        return self.tokenizer_json if self.tokenizer_json is not None else self.tokenizer_file.read_text()


# --------------------------------------------------------------------------------------------
# config


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


# --------------------------------------------------------------------------------------------
# weight names

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


# --------------------------------------------------------------------------------------------
# quantized weights (docs/model-format.md, "Quantized checkpoints")

QUANTIZED_DTYPES = ("F8_E4M3", "I8")
FP8_BLOCK, FP4_GROUP = 128, 32


def scale_name(weight: str) -> str:
    """`X.weight` -> its block scale `X.scale` (canonical spelling)."""
    return weight.removesuffix("weight") + "scale"


def _check_quantized(name: str, info: TensorInfo, shape: tuple[int, ...], tensors: dict[str, TensorInfo],
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


# --------------------------------------------------------------------------------------------
# the directory


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ModelDirError(f"{index}: not a valid safetensors index ({e})") from None
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise ModelDirError(f"{index}: weight_map must map tensor names to shard file names")
        # one Path per shard, not per tensor (the release lists ~70,000 tensors in 48 shards)
        files = sorted(path / f for f in set(weight_map.values()))
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise ModelDirError(f"{index}: lists shard(s) that do not exist: {', '.join(missing)}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelDirError(f"{path}: no weights (expected model.safetensors or model.safetensors.index.json)")
    return files


def _chat_template(path: Path, tok_cfg: dict) -> str | None:
    jinja = path / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text()
    tmpl = tok_cfg.get("chat_template")
    if isinstance(tmpl, list):  # HF's list of named templates
        tmpl = next((t.get("template") for t in tmpl if t.get("name") == "default"), None)
    if not isinstance(tmpl, str) or not tmpl:
        return None   # as the first DeepSeek-V4 release: the native V4 encoding is used (chat_encoding.py)
    return tmpl


def _read_json(file: Path, missing: str) -> dict:
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise ModelDirError(missing) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelDirError(f"{file}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ModelDirError(f"{file}: expected a JSON object, got {type(data).__name__}")
    return data


def _token_text(v) -> str | None:
    return v.get("content") if isinstance(v, dict) else v


def check_tensors(path: Path, cfg: dict, tensors: dict[str, TensorInfo], *, source: str = "config.json",
                  spell=None) -> dict[str, TensorInfo]:
    """Check every tensor the config needs against it (present, shape, float or integer dtype, quantized
    layout); return the ones the model uses. source: where the expected shapes come from (for the
    message); spell: canonical name -> the name to report a missing tensor by (the file's spelling)."""
    want = expected_shapes(cfg)
    missing = sorted(set(want) - set(tensors))
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        names = [spell(m) if spell else m for m in missing[:5]]
        raise ModelDirError(f"{path}: missing tensor(s) {', '.join(names)}{more}")
    quant = cfg.get("quantization")
    scales: set[str] = set()
    for name, shape in want.items():
        info = tensors[name]
        if info.dtype in QUANTIZED_DTYPES:
            scales.add(_check_quantized(name, info, shape, tensors, quant))
            continue
        if info.shape != shape:
            raise ModelDirError(
                f"{info.file}: tensor {info.name!r} has shape {list(info.shape)}, expected {list(shape)} from {source}")
        is_int = name.endswith("tid2eid")
        if is_int != (info.dtype in ("I64", "I32")):
            raise ModelDirError(f"{info.file}: tensor {info.name!r} has dtype {info.dtype}, "
                                f"expected {'an integer' if is_int else 'a float'} dtype")
    return {k: v for k, v in tensors.items() if k in want or k in scales}


def open_model_dir(path: str | Path, *, digest_cache: str | Path | None = None, log=None) -> ModelDir:
    """Read and check a model directory. Weight bytes are read once, for the fingerprint (every
    byte of every shard, weight_digest.py); with ``digest_cache`` (a file outside the model
    directory) a restart of an unchanged model reads none of them."""
    path = Path(path).expanduser().resolve()
    from .gguf_dir import find_gguf, open_gguf

    gguf = find_gguf(path)   # a .gguf file, or a directory holding one GGUF set and no config.json
    if gguf is not None:
        return open_gguf(gguf, digest_cache=digest_cache, log=log)
    if not path.is_dir():
        if path.exists():        # a file, but not a .gguf one
            raise ModelDirError(f"{path}: not a model directory or GGUF file (--model takes a directory with "
                                "config.json, or a .gguf file; docs/model-format.md)")
        raise ModelDirError(f"{path}: model directory does not exist")
    cfg_file = path / "config.json"
    cfg = resolve_config(_read_json(cfg_file, f"{cfg_file}: missing (a model directory needs config.json)"),
                         str(cfg_file))

    tok_file = path / "tokenizer.json"
    if not tok_file.exists():
        raise ModelDirError(f"{path}: missing tokenizer.json (the tokenizer ships with the model directory)")
    tok_cfg = _read_json(path / "tokenizer_config.json",
                         f"{path}: missing tokenizer_config.json (bos/eos tokens and chat template)")
    template = _chat_template(path, tok_cfg)

    headers: list[bytes] = []
    tensors: dict[str, TensorInfo] = {}
    ignored = [0, 0]   # tensors, bytes: the release's speculative heads (mtp.*: MTP, or 0731's DSpark drafter)
    digests = DigestCache(digest_cache)
    files = _weight_files(path)
    for f in files:
        try:
            raw, infos = read_header(f)
        except SafetensorsError as e:
            raise ModelDirError(str(e)) from None
        headers.append(f.name.encode() + b"\0" + raw)
        for name, info in infos.items():
            canon = canonical_name(name)
            if canon is None:
                ignored[0] += 1
                ignored[1] += info.end - info.start
                continue
            if canon in tensors:
                raise ModelDirError(f"{f}: tensor {name!r} duplicates one in {tensors[canon].file.name}")
            tensors[canon] = info

    tensors = check_tensors(path, cfg, tensors)
    log_ignored(log, *ignored, "mtp.*")

    # Only a directory that passed every check is hashed (every byte; cached: weight_digest.py).
    headers = [h + bytes.fromhex(d) for h, d in zip(headers, hash_weight_files(digests, files, log))]

    h = hashlib.sha256()
    h.update(json.dumps(cfg, sort_keys=True).encode())
    for raw in headers:
        h.update(raw)
    h.update(hashlib.sha256(tok_file.read_bytes()).digest())
    bos, eos = _token_text(tok_cfg.get("bos_token")) or "", _token_text(tok_cfg.get("eos_token")) or ""
    h.update(json.dumps([template, bos, eos]).encode())
    return ModelDir(path=path, config=cfg, tensors=tensors, fingerprint=h.hexdigest(),
                    tokenizer_file=tok_file, chat_template=template,
                    bos_token=bos, eos_token=eos)


def log_ignored(log, tensors: int, nbytes: int, where: str) -> None:
    """One line for the tensors a model carries that cairn does not run (the speculative heads)."""
    if tensors and log is not None:
        log.info("model_tensors_ignored", tensors=tensors, bytes=nbytes, names=where,
                 why="speculative-decoding heads (MTP, or V4-Flash-0731's DSpark drafter): not run by cairn")


def map_weights(md: ModelDir, maps: FileMaps | None = None) -> dict[str, tuple[np.ndarray, str]]:
    """Every tensor as a view of its file's one memory map (FileMaps): canonical name -> (array,
    dtype tag). BF16 arrives as uint16 bits, FP8 and ue8m0 scales as uint8 bytes, FP4 as int8 pairs
    of nibbles: the kernel reads the stored bytes (no widening here)."""
    maps = maps if maps is not None else FileMaps()
    try:
        return {name: (maps.tensor(info), info.dtype) for name, info in md.tensors.items()}
    except SafetensorsError as e:
        raise ModelDirError(str(e)) from None


PACKED_CACHE_MIN_BYTES = 256 << 20  # smaller models pack in well under a second: not worth a file


def packed_cache_file(md: ModelDir, cache_dir: str | Path, widen_bf16: bool = False) -> Path:
    """Where a model's packed panels are cached: named by the model directory (packed_cache.source_key,
    so the trim knows an older version of the same model's file) and its fingerprint (the file's header
    repeats it, with the panel layout, and a mismatch re-packs)."""
    from .packed_cache import source_key

    return Path(cache_dir) / f"{source_key(md.path)}-{md.fingerprint[:32]}{'-widened' if widen_bf16 else ''}.pack"


def hash_weight_files(digests, files, log=None) -> list[str]:
    """Every file's digest (weight_digest.DigestCache: cached by size and mtime), one log line for
    what had to be read, the cache saved (a failure costs a rehash at the next start, nothing else)."""
    t0 = time.perf_counter()
    out = digests.digest_all(files)
    if digests.hashed and log is not None:
        secs = time.perf_counter() - t0
        size = sum(f.stat().st_size for f in digests.hashed)
        log.info("model_weights_hashed", files=len(digests.hashed), bytes=size, seconds=round(secs, 2),
                 mb_s=round(size / max(secs, 1e-9) / 1e6), cache=str(digests.file) if digests.file else None)
    try:
        digests.save()
    except OSError as e:
        if log is not None:
            log.warning("weight_digest_cache_not_saved", file=str(digests.file), error=f"{e.strerror or e}")
    return out


def load_model(path: str | Path | ModelDir, threads: int = 0, *, widen_bf16: bool = False,
               packed_cache: str | Path | None = None, packed_cache_min_bytes: int = PACKED_CACHE_MIN_BYTES,
               expert_cache_bytes: int | None = None, packed_cache_budget: int | None = None,
               page_tokens: int = 0):
    """Open a model directory and build the kernel's immutable Model from it. packed_cache: a
    directory for the packed panels of models of at least packed_cache_min_bytes of weights: the
    first start packs and writes them there (atomically), later starts map them instead of packing
    (no weight matrix is read until used). An unusable directory only costs the cache.
    expert_cache_bytes: a byte budget for routed experts paged from the packed file (None: all
    resident); it needs packed_cache (any model size), and the kernel says so when it is missing.
    packed_cache_budget: after the load, the packed_cache directory is trimmed (packed_cache.py): older
    versions of this model's file go, and other models' files, least recently used first, while the
    directory holds more than this many bytes (0: no cap; None: no trimming at all). page_tokens:
    the size of a state's page groups (0: the kernel's default)."""
    from cairn import _kernel

    md = path if isinstance(path, ModelDir) else open_model_dir(path)
    cache = ""
    paging = bool(expert_cache_bytes)
    big = sum(t.end - t.start for t in md.tensors.values()) >= packed_cache_min_bytes
    if packed_cache is not None and (big or paging):
        try:
            Path(packed_cache).mkdir(parents=True, exist_ok=True)
            cache = str(packed_cache_file(md, packed_cache, widen_bf16))
        except OSError:
            cache = ""
    maps = FileMaps()
    model = _kernel.Model(md.config, map_weights(md, maps), md.fingerprint, threads, widen_bf16=widen_bf16,
                          packed_cache=cache, expert_cache_bytes=expert_cache_bytes or 0, page_tokens=page_tokens)
    # The kernel has packed (or mapped from the cache) every matrix and released their sources; what
    # it keeps in place (norms, biases, the BF16 embedding) pins its file's map: drop the pages packing
    # touched from the resident set (the maps of files no kept tensor uses close with `maps`).
    maps.drop_resident()
    if cache:
        from .packed_cache import trim_packed_cache

        try:
            os.utime(cache)  # its last use: trimming removes the least recently used files first
        except OSError:
            pass
        if packed_cache_budget is not None:
            trim_packed_cache(packed_cache, cache, packed_cache_budget)
    return model
