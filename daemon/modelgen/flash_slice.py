"""`cairn make-model --preset flash-slice [--first-layer K] --layers N`: DeepSeek-V4-Flash's real
dimensions and byte layout with N of its layers (K .. K+N-1, renumbered from 0; K defaults to 0) and
random weights, for benchmarks and load tests.

The directory is what the official release holds, cut to N layers: official tensor names, shard 1
the embedding, shard L+2 layer L, then head/norm/hc_head, an index json (the flash-shape preset, all 43
layers at toy width, adds V4-Flash-0731's DSpark drafter: three `mtp.{i}.` blocks, a shard each, last); FP8 e4m3
projections with ue8m0 128x128 block scales, FP4 e2m1 routed experts (I8 pairs, one scale per row
per 32), BF16 embedding/head/norms/router/compressors, F32 hyper-connection parameters, sinks,
position biases and router biases. At 43 layers it would be the size of the release (~160 GB).

Codes are drawn directly (never as fp32 matrices, which would need 8x the memory): each format's
codes follow a normal distribution quantized to its grid (FP8 sigma 64 of 448, FP4 sigma 2 of 6),
with scales that give the weights a standard deviation near 1/sqrt(fan_in), the quantization of
N(0, 1/fan_in) weights. Each tensor has its own generator seeded by (seed, name), so any tensor is
reproducible alone and the files are deterministic.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import replace
from math import erf, sqrt
from pathlib import Path

import numpy as np

from .quantize import FP4_GROUP, FP8_BLOCK, _E2M1, _E4M3
from cairn.daemon.weights.safetensors_io import DTYPES, to_bf16_bits, write_file_lazy

_ROW_BLOCK = 8192  # rows of the embedding and head made at a time (256 MB of fp32)


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def _code_table(values: np.ndarray, sigma: float, sign_bit: int, n: int) -> np.ndarray:
    """n-entry table: uniform index -> code whose value is a N(0, sigma) sample rounded to the grid."""
    mids = (values[1:] + values[:-1]) / 2
    cdf = np.array([0.5 * (1 + erf(m / (sigma * sqrt(2)))) for m in mids])
    # probability of |x| rounding to each magnitude, then the index ranges that pick each
    p_mag = np.diff(np.concatenate([[0.5], cdf, [1.0]])) * 2
    edges = np.round(np.cumsum(p_mag) / p_mag.sum() * (n // 2)).astype(np.int64)
    mag = np.searchsorted(edges, np.arange(n // 2), side="right")
    mag = np.minimum(mag, len(values) - 1).astype(np.uint8)
    return np.concatenate([mag, mag | np.where(mag > 0, sign_bit, 0).astype(np.uint8)])


_FP8_TABLE = _code_table(_E4M3, 64.0, 0x80, 1 << 16)  # uint16 -> e4m3 code
_FP4_NIBBLE = _code_table(_E2M1, 2.0, 8, 256)          # uint8 -> e2m1 code
_FP4_BYTE = (_FP4_NIBBLE[np.arange(1 << 16) & 255] | (_FP4_NIBBLE[np.arange(1 << 16) >> 8] << 4)).astype(np.uint8)


def _scale_bytes(rng, shape, fan_in: int, sigma_q: float) -> np.ndarray:
    centre = 127 + round(np.log2(1.0 / (sigma_q * np.sqrt(fan_in))))
    return (centre + rng.integers(-1, 2, size=shape)).astype(np.uint8)


def _fp8(entries: dict, name: str, out: int, inp: int, seed: int) -> None:
    def codes():
        return _FP8_TABLE[_rng(seed, name).integers(0, 1 << 16, size=(out, inp), dtype=np.uint16)]

    def scales():
        return _scale_bytes(_rng(seed, name + "#s"), (-(-out // FP8_BLOCK), -(-inp // FP8_BLOCK)), inp, 64.0)

    entries[name] = ((out, inp), "F8_E4M3", codes)
    entries[name.removesuffix("weight") + "scale"] = ((-(-out // FP8_BLOCK), -(-inp // FP8_BLOCK)), "F8_E8M0", scales)


def _fp4(entries: dict, name: str, out: int, inp: int, seed: int) -> None:
    def codes():
        return _FP4_BYTE[_rng(seed, name).integers(0, 1 << 16, size=(out, inp // 2), dtype=np.uint16)].view(np.int8)

    def scales():
        return _scale_bytes(_rng(seed, name + "#s"), (out, inp // FP4_GROUP), inp, 2.0)

    entries[name] = ((out, inp // 2), "I8", codes)
    entries[name.removesuffix("weight") + "scale"] = ((out, inp // FP4_GROUP), "F8_E8M0", scales)


def _matrix_bf16(entries: dict, name: str, out: int, inp: int, seed: int) -> None:
    def make():
        rng = _rng(seed, name)
        for r0 in range(0, out, _ROW_BLOCK):
            rows = min(_ROW_BLOCK, out - r0)
            yield to_bf16_bits(rng.standard_normal((rows, inp), dtype=np.float32) * np.float32(1 / np.sqrt(inp)))

    entries[name] = ((out, inp), "BF16", make)


def _vec(entries: dict, name: str, shape, mean: float, std: float, tag: str, seed: int) -> None:
    def make():
        v = (mean + std * _rng(seed, name).standard_normal(shape, dtype=np.float32)).astype(np.float32)
        return to_bf16_bits(v) if tag == "BF16" else v

    entries[name] = (tuple(shape), tag, make)


def _layer(p, i: int, seed: int, prefix: str | None = None, kind: str | None = None,
           mlp: str | None = None) -> dict:
    """Layer i's tensors; prefix/kind/mlp given: a drafter block (mtp.{i}., its own layer kind)."""
    from .make_model import C, S

    D, N, E, I = p.hidden_size, p.hc_mult, p.n_routed_experts, p.moe_intermediate_size
    H, Dh, Rq = p.num_attention_heads, p.head_dim, p.q_lora_rank
    e: dict = {}
    L, kind = prefix or f"layers.{i}.", kind or p.layer_types[i]
    mlp = mlp or p.mlp_layer_types[i]
    A, F = L + "attn.", L + "ffn."
    _vec(e, L + "attn_norm.weight", (D,), 1.0, 0.1, "BF16", seed)
    _vec(e, L + "ffn_norm.weight", (D,), 1.0, 0.1, "BF16", seed)
    for blk in ("attn", "ffn"):
        _vec(e, f"{L}hc_{blk}_fn", ((2 + N) * N, N * D), 0.0, 1.0 / np.sqrt(N * D), "F32", seed)
        _vec(e, f"{L}hc_{blk}_base", ((2 + N) * N,), 0.0, 0.5, "F32", seed)
        _vec(e, f"{L}hc_{blk}_scale", (3,), 1.0, 0.2, "F32", seed)
    _fp8(e, A + "wq_a.weight", Rq, D, seed)
    _vec(e, A + "q_norm.weight", (Rq,), 1.0, 0.1, "BF16", seed)
    _fp8(e, A + "wq_b.weight", H * Dh, Rq, seed)
    _fp8(e, A + "wkv.weight", Dh, D, seed)
    _vec(e, A + "kv_norm.weight", (Dh,), 1.0, 0.1, "BF16", seed)
    _fp8(e, A + "wo_a.weight", p.o_groups * p.o_lora_rank, H * Dh // p.o_groups, seed)
    _fp8(e, A + "wo_b.weight", D, p.o_groups * p.o_lora_rank, seed)
    _vec(e, A + "attn_sink", (H,), 0.0, 1.0, "F32", seed)
    if kind != S:
        rate, width = (p.csa_rate, 2 * Dh) if kind == C else (p.hca_rate, Dh)
        _matrix_bf16(e, A + "compressor.wkv.weight", width, D, seed)
        _matrix_bf16(e, A + "compressor.wgate.weight", width, D, seed)
        _vec(e, A + "compressor.ape", (rate, width), 0.0, 0.5, "F32", seed)
        _vec(e, A + "compressor.norm.weight", (Dh,), 1.0, 0.1, "BF16", seed)
    if kind == C:
        Di, nI = p.index_head_dim, p.index_n_heads
        _matrix_bf16(e, A + "indexer.compressor.wkv.weight", 2 * Di, D, seed)
        _matrix_bf16(e, A + "indexer.compressor.wgate.weight", 2 * Di, D, seed)
        _vec(e, A + "indexer.compressor.ape", (p.csa_rate, 2 * Di), 0.0, 0.5, "F32", seed)
        _vec(e, A + "indexer.compressor.norm.weight", (Di,), 1.0, 0.1, "BF16", seed)
        _fp8(e, A + "indexer.wq_b.weight", nI * Di, Rq, seed)
        _matrix_bf16(e, A + "indexer.weights_proj.weight", nI, D, seed)
    _matrix_bf16(e, F + "gate.weight", E, D, seed)
    if mlp == "hash_moe":
        k, V = p.num_experts_per_tok, p.vocab_size
        e[F + "gate.tid2eid"] = ((V, k), "I64", lambda: np.argsort(
            _rng(seed, F + "gate.tid2eid").random((V, E), dtype=np.float32), axis=1)[:, :k].astype(np.int64))
    else:
        _vec(e, F + "gate.bias", (E,), 0.0, 0.1, "F32", seed)
    expert = _fp4 if p.quant == "fp4" else _fp8
    for x in range(E):
        expert(e, f"{F}experts.{x}.w1.weight", I, D, seed)
        expert(e, f"{F}experts.{x}.w2.weight", D, I, seed)
        expert(e, f"{F}experts.{x}.w3.weight", I, D, seed)
    _fp8(e, F + "shared_experts.w1.weight", I, D, seed)
    _fp8(e, F + "shared_experts.w2.weight", D, I, seed)
    _fp8(e, F + "shared_experts.w3.weight", I, D, seed)
    return e


def flash_slice_shards(p, seed: int) -> list[dict]:
    """The shards of preset p in the official layout, in file order: each maps tensor name ->
    (shape, dtype tag, maker). Nothing is drawn until a maker runs, so this is cheap at any width."""
    D, N, V = p.hidden_size, p.hc_mult, p.vocab_size
    first: dict = {"embed.weight": ((V, D), "BF16", _embed_maker(V, D, seed))}
    last: dict = {}
    _matrix_bf16(last, "head.weight", V, D, seed)
    _vec(last, "norm.weight", (D,), 1.0, 0.1, "BF16", seed)
    _vec(last, "hc_head_fn", (N, N * D), 0.0, 1.0 / np.sqrt(N * D), "F32", seed)
    _vec(last, "hc_head_base", (N,), 0.0, 0.5, "F32", seed)
    _vec(last, "hc_head_scale", (1,), 1.0, 0.2, "F32", seed)
    shards = [first] + [_layer(p, i, seed) for i in range(len(p.layer_types))] + [last]
    return shards + [_drafter_block(p, b, seed) for b in range(p.drafter_blocks)]


def write_flash_slice(p, seed: int, out: Path, progress=None) -> None:
    """The weights of preset p (flash dimensions, N layers) in the official sharded layout."""
    shards = flash_slice_shards(p, seed)
    for stale in out.glob("model*.safetensors*"):
        stale.unlink()
    weight_map, total = {}, 0
    for n, entries in enumerate(shards, 1):
        fname = f"model-{n:05d}-of-{len(shards):05d}.safetensors"
        if progress:
            progress(f"writing {fname} ({len(entries)} tensors)")
        write_file_lazy(out / fname, entries)
        for name, (shape, tag, _) in entries.items():
            weight_map[name] = fname
            total += int(np.prod(shape, dtype=np.int64)) * DTYPES[tag].itemsize
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _drafter_block(p, b: int, seed: int) -> dict:
    """DSpark drafter block b as V4-Flash-0731 stores it, in the last shards: a V4 layer under `mtp.{b}.`
    with sliding-window attention (no compressor or indexer) and a routed MoE, the last block also
    carrying the Markov head (`markov_head.markov_w1/w2`) and the confidence head
    (`confidence_head.proj.weight`). Names from the release's index (4,705 `mtp.*` tensors in three
    blocks); shapes here are stand-ins of this preset's width: nothing reads them."""
    from .make_model import S

    e = _layer(p, b, seed, prefix=f"mtp.{b}.", kind=S, mlp="moe")
    if b == p.drafter_blocks - 1:
        D, rank = p.hidden_size, 16
        _matrix_bf16(e, f"mtp.{b}.markov_head.markov_w1", rank, D, seed)
        _matrix_bf16(e, f"mtp.{b}.markov_head.markov_w2", p.vocab_size, rank, seed)
        _matrix_bf16(e, f"mtp.{b}.confidence_head.proj.weight", 1, 2 * D, seed)
    return e


def _embed_maker(V: int, D: int, seed: int):
    def make():  # unit-variance rows, as make_model's embedding
        rng = _rng(seed, "embed.weight")
        for r0 in range(0, V, _ROW_BLOCK):
            yield to_bf16_bits(rng.standard_normal((min(_ROW_BLOCK, V - r0), D), dtype=np.float32))
    return make


def flash_slice_preset(flash, layers: int | None, first_layer: int = 0):
    """Layers first_layer .. first_layer+layers-1 of preset `flash` (layers None: through the last),
    renumbered from 0. Both per-layer fields (attention kind, MLP kind) are cut from the same range,
    and config.json lists both explicitly (`layer_types`, `mlp_layer_types`: HF and cairn take them
    over the legacy "first num_hash_layers layers"), so a slice from layer 2 keeps its hash routing."""
    n = len(flash.layer_types)
    if isinstance(first_layer, bool) or not isinstance(first_layer, int) or not 0 <= first_layer < n:
        raise ValueError(f"--first-layer must be in 0..{n - 1} (the preset has {n} layers), got {first_layer!r}")
    room = n - first_layer
    layers = room if layers is None else layers
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= room:
        raise ValueError(f"--layers must be in 1..{room} with --first-layer {first_layer} (--first-layer + "
                         f"--layers <= {n}, the preset's layer count), got {layers!r}")
    cut = slice(first_layer, first_layer + layers)
    return replace(flash, layer_types=flash.layer_types[cut], mlp_layer_types=flash.mlp_layer_types[cut])
