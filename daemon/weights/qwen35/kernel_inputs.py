"""A Qwen3.5 model's files -> what `_kernel.Qwen35Model(config, weights)` takes: the resolved config
and {canonical name: float32 array or a GGUF block format's stored rows} (docs/model-format.md, "Qwen3.5").

`open_model_dir` hands a Qwen3.5 directory or GGUF file here (families.py: the family's `open_dir`).
`open_qwen35` is the
shared flow (model_dir.py / gguf_dir.py helpers, this family's names and shapes, the same fingerprint
recipe) plus the two steps the shared flow lacks: HF's fused 3-D experts split into per-expert byte
ranges, and a GGUF's tensors mapped with the converter's transforms undone. `load_model` calls
`kernel_weights` through the family's `kernel_inputs`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from .. import model_dir as md_mod
from ..errors import ModelDirError
from ..ggml_types import is_ggml
from ..safetensors_io import FileMaps, SafetensorsError, TensorInfo, read_header
from ..weight_digest import DigestCache
from . import gguf as qgguf
from .config import FP8_BLOCKS, conv_dim, resolve_config
from .names import IGNORED, canonical_name, expected_shapes, split_fused_experts

FAMILY_NAME = "qwen3_5"


def open_qwen35(path: str | Path, *, digest_cache: str | Path | None = None, log=None) -> md_mod.ModelDir:
    """Read and check a Qwen3.5 model directory (safetensors) or GGUF file (arch qwen35 / qwen35moe)."""
    from ..gguf_dir import find_gguf

    path = Path(path).expanduser().resolve()
    gguf = find_gguf(path)
    if gguf is not None:
        return _open_gguf(gguf, digest_cache, log)
    cfg_file = path / "config.json"
    cfg = resolve_config(md_mod._read_json(cfg_file, f"{cfg_file}: missing (a model directory needs config.json)"),
                         str(cfg_file))
    tok_file = path / "tokenizer.json"
    if not tok_file.exists():
        raise ModelDirError(f"{path}: missing tokenizer.json (the tokenizer ships with the model directory)")
    tok_cfg = md_mod._read_json(path / "tokenizer_config.json", f"{path}: missing tokenizer_config.json")
    template = md_mod._chat_template(path, tok_cfg)
    headers: list[bytes] = []
    tensors: dict[str, TensorInfo] = {}
    ignored = [0, 0]
    files = md_mod._weight_files(path)
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
    tensors = _check(path, cfg, split_fused_experts(tensors, cfg), "config.json", None)
    md_mod.log_ignored(log, *ignored, IGNORED, why="not the text model (a vision tower, the MTP head): not run by cairn")
    digests = DigestCache(digest_cache)
    headers = [h + bytes.fromhex(d) for h, d in zip(headers, md_mod.hash_weight_files(digests, files, log))]
    h = hashlib.sha256(json.dumps(cfg, sort_keys=True).encode())
    for raw in headers:
        h.update(raw)
    h.update(hashlib.sha256(tok_file.read_bytes()).digest())
    bos, eos = md_mod._token_text(tok_cfg.get("bos_token")) or "", md_mod._token_text(tok_cfg.get("eos_token")) or ""
    h.update(json.dumps([template, bos, eos]).encode())
    return md_mod.ModelDir(path=path, config=cfg, tensors=tensors, fingerprint=h.hexdigest(), tokenizer_file=tok_file,
                           chat_template=template, bos_token=bos, eos_token=eos, family=FAMILY_NAME)


def _check(path: Path, cfg: dict, tensors: dict[str, TensorInfo], source: str, spell) -> dict[str, TensorInfo]:
    """Every tensor the config needs: present, its shape, a float dtype (or a GGUF block type, or FP8
    with its block scales `<name>_scale_inv` when config.json says so)."""
    want = expected_shapes(cfg)
    for name, shape in list(want.items()):
        info = tensors.get(name)
        if info is None or info.dtype != "F8_E4M3":
            continue
        if cfg.get("quantization") != FP8_BLOCKS:
            raise ModelDirError(f"{info.file}: tensor {info.name!r} is F8_E4M3 but config.json has no FP8 "
                                "quantization_config (quant_method fp8, weight_block_size [128, 128])")
        if len(shape) != 2:
            raise ModelDirError(f"{info.file}: tensor {info.name!r} is F8_E4M3; only matrices can be")
        scale = name + "_scale_inv"
        want[scale] = (-(-shape[0] // 128), -(-shape[1] // 128))
        if scale in tensors and tensors[scale].dtype not in ("BF16", "F32"):
            raise ModelDirError(f"{tensors[scale].file}: tensor {tensors[scale].name!r} has dtype "
                                f"{tensors[scale].dtype}; FP8 block scales are BF16 or F32")
    missing = sorted(set(want) - set(tensors))
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ModelDirError(f"{path}: missing tensor(s) {', '.join(spell(m) if spell else m for m in missing[:5])}{more}")
    for name, shape in want.items():
        info = tensors[name]
        if info.shape != shape:
            raise ModelDirError(f"{info.file}: tensor {info.name!r} has shape {list(info.shape)}, expected "
                                f"{list(shape)} from {source}")
        if info.dtype not in ("F32", "BF16", "F16", "F8_E4M3") and not is_ggml(info.dtype):
            raise ModelDirError(f"{info.file}: tensor {info.name!r} has dtype {info.dtype}; Qwen3.5 weights are "
                                "read as F32, BF16, F16 or F8_E4M3 (with block scales)")
    return {k: v for k, v in tensors.items() if k in want}


def _open_gguf(first: Path, digest_cache, log) -> md_mod.ModelDir:
    from .. import gguf_dir as G

    files = G.split_files(first)
    readers = [G._read(f) for f in files]
    meta = G._fields(readers[0])
    where = str(first)
    if len(files) > 1 or "split.count" in meta:
        G._check_split(files, readers, meta)
    names = {t.name for r in readers for t in r.tensors}
    raw = qgguf.config_from_metadata(meta, where, tied="output.weight" not in names)
    cfg = resolve_config(raw, f"{where} (GGUF metadata)")
    tok = G.tokenizer_from_metadata(meta, where)
    tensors: dict[str, TensorInfo] = {}
    ignored = [0, 0]
    for f, r in zip(files, readers):
        _gguf_infos(f, r, cfg, tensors, ignored)
    md_mod.log_ignored(log, *ignored, f"blk.{cfg['num_hidden_layers']}+ (MTP)")
    del readers
    tensors = _check(first, cfg, tensors, "the GGUF metadata", qgguf.gguf_name)
    template = meta.get("tokenizer.chat_template") or None
    tokens = meta["tokenizer.ggml.tokens"]
    bos_id, eos_id = cfg.get("bos_token_id"), cfg.get("eos_token_id")
    bos = tokens[bos_id] if isinstance(bos_id, int) and 0 <= bos_id < len(tokens) else ""
    eos = tokens[eos_id] if isinstance(eos_id, int) and 0 <= eos_id < len(tokens) else ""
    tok_json = tok.to_str()
    h = hashlib.sha256(json.dumps(cfg, sort_keys=True).encode())
    for i, d in enumerate(md_mod.hash_weight_files(DigestCache(digest_cache), files, log)):
        h.update(f"gguf part {i + 1} of {len(files)}".encode() + b"\0" + bytes.fromhex(d))
    h.update(hashlib.sha256(tok_json.encode()).digest())
    h.update(json.dumps([template, bos, eos]).encode())
    return md_mod.ModelDir(path=first, config=cfg, tensors=tensors, fingerprint=h.hexdigest(), tokenizer_file=first,
                           chat_template=template, bos_token=bos, eos_token=eos, tokenizer_json=tok_json,
                           family=FAMILY_NAME)


def _gguf_infos(file: Path, reader, cfg: dict, tensors: dict[str, TensorInfo], ignored: list[int]) -> None:
    """The file's tensors by canonical name (stacked experts: a view per expert; the squeezed conv as
    HF's [conv_dim, 1, K] and a vector shared-expert gate as [1, D], the same bytes)."""
    from ..gguf_dir import _dtype_tag

    K, cd = cfg["linear_conv_kernel_dim"], conv_dim(cfg)

    def add(canon: str, info: TensorInfo) -> None:
        if canon in tensors:
            raise ModelDirError(f"{file}: tensor {info.name!r} duplicates one in {tensors[canon].file.name}")
        tensors[canon] = info

    for t in reader.tensors:
        kind, canon, layer = qgguf.tensor_name(t.name, cfg["num_hidden_layers"])
        if kind == "ignored":
            ignored[0] += 1
            ignored[1] += int(t.n_bytes)
            continue
        if kind == "skip":
            continue
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        tag = _dtype_tag(file, t.name, t.tensor_type.name, shape)
        start = int(t.data_offset)
        if kind == "tensor":
            if canon.endswith("linear_attn.conv1d.weight") and shape == (cd, K):
                shape = (cd, 1, K)
            if canon.endswith("mlp.shared_expert_gate.weight") and len(shape) == 1:
                shape = (1, *shape)   # llama-quantize writes it as a vector: the same bytes
            add(canon, TensorInfo(file, t.name, tag, shape, start, start + int(t.n_bytes)))
            continue
        want, per = qgguf.expert_views(cfg, layer, canon)
        if shape != want:
            raise ModelDirError(f"{file}: tensor {t.name!r} has shape {list(shape)} (ggml ne {list(shape[::-1])}), "
                                f"expected {list(want)} ([n_expert, out, in]) from the GGUF metadata")
        each = int(t.n_bytes) // want[0]
        for e, name in enumerate(per):
            s = start + e * each
            if canon != "gate_up":
                add(name, TensorInfo(file, f"{t.name}[{e}]", tag, want[1:], s, s + each))
                continue
            P, half = name.removesuffix("gate_up"), each // 2    # gate rows, then up rows
            add(P + "gate_proj.weight", TensorInfo(file, f"{t.name}[{e}, :I]", tag, (want[1] // 2, want[2]), s, s + half))
            add(P + "up_proj.weight", TensorInfo(file, f"{t.name}[{e}, I:]", tag, (want[1] // 2, want[2]), s + half, s + each))


def kernel_weights(md: md_mod.ModelDir, maps: FileMaps | None = None) -> tuple[dict, dict]:
    """(config, weights) for `_kernel.Qwen35Model(config, weights)`: canonical name -> float32 array, or
    what the kernel packs as stored: BF16 bits as (uint16 array, "BF16"), FP8 codes as (uint8 array,
    "F8_E4M3") beside their block scales `<name>_scale_inv`, a GGUF block format's rows as (uint8 array,
    "GGML:<type>").

    F32 and BF16 tensors are zero-copy views of the files' memory maps; F16 is widened (exact). A GGUF's
    converter transforms (gguf.py) are handed to the kernel as stored where it has an input for them
    (folded norms as `<name>+1`, ssm_a), and undone where they are a permutation: v heads un-tiled, by
    rows for block formats too; a block-format ssm_out keeps its tiled columns (`out_proj.weight:tiled`).
    The daemon's load path calls this (qwen35/__init__.kernel_inputs).
    """
    maps = maps if maps is not None else FileMaps()
    from_gguf = md.path.suffix == ".gguf"
    out: dict = {}
    for name, info in md.tensors.items():
        try:
            a = maps.tensor(info)
        except SafetensorsError as e:
            raise ModelDirError(str(e)) from None
        stored = is_ggml(info.dtype) or info.dtype in ("BF16", "F8_E4M3")   # the kernel packs these as they are
        if not stored:
            a = _float32(a, info)
        if not from_gguf:
            out[name] = (a, info.dtype) if stored else a
            continue
        if is_ggml(info.dtype) and name.endswith(".linear_attn.out_proj.weight") and qgguf.untile_perm(md.config, 1) is not None:
            name += ":tiled"
        else:
            a = qgguf.untile(name, a, md.config)
        if qgguf.is_folded_norm(name):
            name += "+1"
        elif name.endswith(".linear_attn.A_log"):
            name = name.removesuffix("A_log") + "ssm_a"
        out[name] = (a, info.dtype) if stored else a
    return md.config, out


def _float32(a: np.ndarray, info: TensorInfo) -> np.ndarray:
    if info.dtype == "F32":
        return a
    if info.dtype == "F16":
        return a.astype(np.float32)
    raise ModelDirError(f"{info.file}: tensor {info.name!r} has dtype {info.dtype}; expected F32, BF16, F16 or a "
                        "GGUF block type")
