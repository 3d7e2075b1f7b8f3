"""Qwen3.5's files -> the kernel's inputs (issue 43 steps 7 and 10; daemon/weights/qwen35/): the
safetensors layouts (per-expert, fused 3-D experts, the conditional-generation release layout with its
vision tower and MTP head ignored and named) give one dict; `_kernel.Qwen35Model` on it, and on the
F32 GGUF fixtures llama.cpp's converter wrote, matches HF's logits; the GGUF's tensors, un-tiled, are
the converter's transform of HF's weights, bit for bit; llama-quantize's block-format mixes compute as
fp32 on their dequantized weights, bit for bit, and as HF on them; bad files are named; the State cost."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFReader
from safetensors.numpy import load_file, save_file

import cairn._kernel as K
from cairn.daemon.modelgen.make_model import make_model
from cairn.daemon.modelgen.qwen35 import fp8_quantized
from cairn.daemon.weights import families
from cairn.daemon.weights.errors import ModelDirError
from cairn.daemon.weights.gguf_dir import _pre_tokenizer
from cairn.daemon.weights.qwen35 import gguf as qgguf
from cairn.daemon.weights.qwen35.kernel_inputs import kernel_weights, open_qwen35
from cairn.daemon.weights.qwen35.names import IGNORED, canonical_name
from cairn.daemon.weights.safetensors_io import to_bf16_bits

from hf_oracle_qwen35 import hf_logits

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "gguf"
MANIFEST = json.loads((FIX / "MANIFEST.json").read_text())["fixtures"]
GGUF = {"qwen35moe-tiny": "qwen35moe-tiny-f32", "qwen35-tiny": "qwen35-tiny-f32"}   # preset -> fixture stem
TOL = 1e-4
SEED = MANIFEST["qwen35moe-tiny-f32"]["seed"]   # every layout of the fixtures' seed
TOKENS = np.random.default_rng(5).integers(0, 512, 80).astype(np.int32)


class Log:
    def __init__(self):
        self.events = []

    def info(self, event, **kw):
        self.events.append((event, kw))

    warning = info


_DIRS: dict[str, Path] = {}


def _dir(preset: str, tmp_path_factory) -> Path:
    """The fixtures' source directory (make_model is deterministic), made once per preset."""
    if preset not in _DIRS:
        _DIRS[preset] = make_model(preset, SEED, tmp_path_factory.mktemp("q35") / preset)
    return _DIRS[preset]


def test_the_three_moe_layouts_give_one_dict(tmp_path_factory):
    base_cfg, base = kernel_weights(open_qwen35(_dir("qwen35moe-tiny", tmp_path_factory)))
    assert "layers.0.mlp.experts.7.down_proj.weight" in base and not any("gate_up" in k for k in base)
    for preset in ("qwen35moe-tiny-fused", "qwen35moe-tiny-cond"):
        log = Log()
        md = open_qwen35(_dir(preset, tmp_path_factory), log=log)
        cfg, w = kernel_weights(md)
        assert cfg == base_cfg, preset   # the nested text_config resolves to the flat config
        assert set(w) == set(base), preset
        for name, a in base.items():
            assert w[name].dtype == np.float32 and np.array_equal(w[name], a), (preset, name)
        ignored = [kw for e, kw in log.events if e == "model_tensors_ignored"]
        if preset.endswith("cond"):
            files = {}
            for f in sorted(md.path.glob("*.safetensors")):
                files |= load_file(f)
            extra = [n for n in files if n.startswith(("model.visual.", "mtp."))]
            assert len(extra) > 10 and all(canonical_name(n) is None for n in extra)
            assert ignored == [dict(ignored[0], tensors=len(extra), names=IGNORED)]
        else:
            assert ignored == []
    # fused experts are per-expert views of the file's one memory map, not copies
    _, fused = kernel_weights(open_qwen35(_dir("qwen35moe-tiny-fused", tmp_path_factory)))
    g0, u0 = fused["layers.0.mlp.experts.0.gate_proj.weight"], fused["layers.0.mlp.experts.0.up_proj.weight"]
    addr = lambda a: a.__array_interface__["data"][0]   # noqa: E731
    assert not g0.flags.owndata and not u0.flags.owndata and addr(u0) == addr(g0) + g0.nbytes   # gate rows, then up


@pytest.mark.parametrize("preset", ["qwen35moe-tiny", "qwen35-tiny"])
def test_safetensors_and_gguf_inputs_match_hf(preset, tmp_path_factory):
    d = _dir(preset, tmp_path_factory)
    ref = hf_logits(d, TOKENS)
    cfg, w = kernel_weights(open_qwen35(d))
    got = K.Qwen35Model(cfg, w).forward(TOKENS)
    assert np.abs(got - ref).max() <= TOL
    gmd = open_qwen35(FIX / f"{GGUF[preset]}.gguf")
    gcfg, gw = kernel_weights(gmd)
    assert gcfg == cfg
    assert gcfg["tie_word_embeddings"] == (preset == "qwen35-tiny")   # no output.weight in the file
    ggot = K.Qwen35Model(gcfg, gw).forward(TOKENS)
    assert np.abs(ggot - ref).max() <= TOL
    # the file's folded norms (1 + w) and ssm_a = -exp(A_log) reach the kernel as stored: the same bits
    # as HF's weights with the converter's fp32 transforms applied (torch's exp, not the kernel's own)
    folded = {}
    for name, a in w.items():
        if qgguf.is_folded_norm(name):
            folded[name + "+1"] = np.float32(1) + a
        elif name.endswith(".linear_attn.A_log"):
            folded[name.removesuffix("A_log") + "ssm_a"] = (-torch.exp(torch.from_numpy(np.asarray(a)))).numpy()
        else:
            folded[name] = a
    assert set(gw) == set(folded)
    np.testing.assert_array_equal(ggot, K.Qwen35Model(cfg, folded).forward(TOKENS))


QUANT = ["qwen35moe-tiny-q8_0", "qwen35moe-tiny-q4_0", "qwen35moe-tiny-q4_k_m",
         "qwen35moe-k256-q4_k_m", "qwen35moe-k256-q6_k", "qwen35moe-k256-iq4_xs"]   # K-quant and IQ blocks at 256


def _dequantized(w: dict) -> dict:
    """The kernel's inputs with every block-format tensor dequantized by gguf-py (llama.cpp's reference),
    names kept (a tiled out_proj stays tiled)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    out = {}
    for name, v in w.items():
        if isinstance(v, tuple):
            rows, tag = v
            v = dequantize(np.ascontiguousarray(rows), GGMLQuantizationType[tag.split(":", 1)[1]]).astype(np.float32)
        out[name] = v
    return out


@pytest.mark.parametrize("stem", QUANT)
def test_block_format_gguf_is_fp32_on_its_dequantized_weights(stem):
    """llama-quantize's mixes: the kernel packs the blocks as stored (the ssm_out of 2 k / 4 v heads in
    llama.cpp's tiled column order) and its logits are bit-identical to fp32 on gguf-py's dequantization."""
    md = open_qwen35(FIX / f"{stem}.gguf")
    cfg, w = kernel_weights(md)
    blocks = {n: v[1] for n, v in w.items() if isinstance(v, tuple)}
    assert set(blocks.values()) == {f"GGML:{t}" for t in MANIFEST[stem]["type_counts"] if t != "F32"}
    assert "layers.0.linear_attn.out_proj.weight:tiled" in blocks and "embed_tokens.weight" in blocks
    model = K.Qwen35Model(cfg, w)
    # every block-format matrix is packed as its blocks: one panel matrix each, a gate with its up in
    # one (both floats when their formats differ); the embedding is decoded for lookups
    want = len(blocks) - 1
    for g in [n for n in blocks if n.endswith("gate_proj.weight")]:
        up = g.replace("gate_proj", "up_proj")
        want -= 1 if blocks.get(up) == blocks[g] else 1 + (up in blocks)
    packed = {f"GGML:{t}": n for t, n in model.panel_formats.items() if t != "F32"}
    assert set(packed) <= set(blocks.values()) and sum(packed.values()) == want
    got = model.forward(TOKENS, chunk=7)
    plain = K.Qwen35Model(cfg, _dequantized(w))
    assert set(plain.panel_formats) == {"F32"}
    np.testing.assert_array_equal(got, plain.forward(TOKENS))


def test_block_format_gguf_matches_hf_on_the_dequantized_weights(tmp_path, tmp_path_factory):
    """HF transformers, given the Q4_0 file's weights dequantized and the converter's transforms undone
    (un-tiled, 1 + w and -exp(A_log) inverted in float64), agrees with the kernel on the file."""
    stem = "qwen35moe-tiny-q4_0"
    md = open_qwen35(FIX / f"{stem}.gguf")
    cfg, w = kernel_weights(md)
    got = K.Qwen35Model(cfg, w).forward(TOKENS)
    hf = {}
    for name, a in _dequantized(w).items():
        if name.endswith("+1"):
            name, a = name[:-2], (a.astype(np.float64) - 1).astype(np.float32)
        elif name.endswith(".ssm_a"):
            name, a = name.removesuffix("ssm_a") + "A_log", np.log(-a.astype(np.float64)).astype(np.float32)
        elif name.endswith(":tiled"):
            name = name.removesuffix(":tiled")
            a = qgguf.untile(name, a, cfg)
        hf[name if name == "lm_head.weight" else "model." + name] = np.ascontiguousarray(a)
    src = _dir("qwen35moe-tiny", tmp_path_factory)
    d = tmp_path / "hf"
    d.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors" and f.is_file():
            (d / f.name).write_bytes(f.read_bytes())
    save_file(hf, d / "model.safetensors")
    assert np.abs(got - hf_logits(d, TOKENS)).max() <= TOL


@pytest.mark.parametrize("preset", ["qwen35moe-tiny", "qwen35-tiny"])
def test_gguf_tensors_are_the_converters_transform_of_hf_weights(preset, tmp_path_factory):
    d = _dir(preset, tmp_path_factory)
    hf = {canonical_name(k): v for k, v in load_file(d / "model.safetensors").items()}
    md = open_qwen35(FIX / f"{GGUF[preset]}.gguf")
    cfg = md.config
    assert cfg["linear_num_key_heads"] != cfg["linear_num_value_heads"]   # the tiled order is exercised
    seen, reordered = 0, set()
    for t in GGUFReader(FIX / f"{GGUF[preset]}.gguf").tensors:
        assert t.tensor_type.name == "F32"
        kind, canon, layer = qgguf.tensor_name(t.name, cfg["num_hidden_layers"])
        a = np.array(t.data).reshape([int(x) for x in reversed(t.shape.tolist())])
        if kind == "experts":
            _, names = qgguf.expert_views(cfg, layer, canon)
            pairs = list(zip(names, a))
        else:
            pairs = [(canon, a)]
        for name, arr in pairs:
            want = hf[name]
            if qgguf.is_folded_norm(name):
                want = np.float32(1) + want
            if name.endswith("A_log"):
                want = (-torch.exp(torch.from_numpy(want))).numpy()
            if name.endswith("conv1d.weight"):
                want = want.squeeze(1)
            if arr.shape != want.shape:
                arr = arr.reshape(want.shape)   # conv [cd, K] vs [cd, 1, K] (squeezed)
            got = qgguf.untile(name, arr, cfg)
            assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist(), (t.name, name)
            if not np.array_equal(arr, want):
                reordered.add(name)
            seen += 1
    assert seen == len(hf)
    G = "layers.0.linear_attn."
    assert {G + p for p in ("in_proj_qkv.weight", "in_proj_z.weight", "in_proj_a.weight", "in_proj_b.weight",
                            "conv1d.weight", "dt_bias", "A_log", "out_proj.weight")} <= reordered


def _save(d: Path, mutate) -> None:
    f = d / "model.safetensors"
    w = load_file(f)
    mutate(w)
    save_file(w, f)


def test_bad_files_are_named(tmp_path):
    d = make_model("qwen35moe-tiny", 0, tmp_path / "shape")
    _save(d, lambda w: w.__setitem__("model.layers.2.self_attn.k_proj.weight", np.zeros((32, 64), np.float32)))
    with pytest.raises(ModelDirError, match=r"tensor 'model\.layers\.2\.self_attn\.k_proj\.weight' has shape "
                                            r"\[32, 64\], expected \[64, 64\] from config\.json"):
        open_qwen35(d)
    d = make_model("qwen35moe-tiny", 0, tmp_path / "missing")
    _save(d, lambda w: w.pop("model.layers.0.linear_attn.A_log"))
    with pytest.raises(ModelDirError, match=r"missing tensor\(s\) layers\.0\.linear_attn\.A_log"):
        open_qwen35(d)
    d = make_model("qwen35moe-tiny-fused", 0, tmp_path / "fused")
    _save(d, lambda w: w.__setitem__("model.layers.1.mlp.experts.down_proj", np.zeros((8, 64, 16), np.float32)))
    with pytest.raises(ModelDirError, match=r"'model\.layers\.1\.mlp\.experts\.down_proj' has shape \[8, 64, 16\], "
                                            r"expected \[8, 64, 32\] \(\[num_experts, hidden_size, moe_intermediate_size\]\)"):
        open_qwen35(d)
    d = make_model("qwen35moe-tiny", 0, tmp_path / "cfg")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "linear_num_value_heads": 3}))
    with pytest.raises(ModelDirError, match=r"linear_num_value_heads \(3\) must be a multiple of linear_num_key_heads \(2\)"):
        open_qwen35(d)
    # GGUF values
    meta = {"general.architecture": "qwen35moe", "qwen35moe.block_count": 6}
    with pytest.raises(ModelDirError, match=r"metadata key 'qwen35moe\.attention\.key_length' is missing"):
        qgguf.config_from_metadata({**meta, "qwen35moe.attention.recurrent_layers": [True] * 6}, "f.gguf")


def test_untile_inverts_the_tiled_order():
    cfg = {"linear_num_key_heads": 2, "linear_num_value_heads": 6, "linear_key_head_dim": 1, "linear_value_head_dim": 2}
    # grouped v heads (k0: v0 v1 v2, k1: v3 v4 v5), head_dim 2 -> tiled [k0v0, k1v0, k0v1, k1v1, ...] as the converter
    grouped = np.arange(12)
    tiled = grouped.reshape(2, 3, 2).transpose(1, 0, 2).reshape(-1)
    assert tiled[:4].tolist() == [0, 1, 6, 7]
    np.testing.assert_array_equal(tiled[qgguf.untile_perm(cfg, 2)], grouped)
    z = np.stack([tiled, tiled * 10]).T   # rows
    np.testing.assert_array_equal(qgguf.untile("layers.0.linear_attn.in_proj_z.weight", z, cfg)[:, 0], grouped)
    out = np.stack([tiled, tiled + 1])   # columns
    np.testing.assert_array_equal(qgguf.untile("layers.0.linear_attn.out_proj.weight", out, cfg)[0], grouped)


def test_qwen35_pre_tokenizer():
    pre = _pre_tokenizer("qwen35", "f.gguf")
    parts = [t for t, _ in pre.pre_tokenize_str("WE'LL pay 1234 now\n\n  ok")]
    # digits one by one, contractions in any case, newline runs alone (Qwen's regex; GPT-2's keeps 1234)
    assert parts == ["WE", "'LL", "Ġpay", "Ġ", "1", "2", "3", "4", "Ġnow", "ĊĊ", "Ġ", "Ġok"]


def test_family_functions_and_refusal():
    f = families.by_name("qwen3_5")
    assert f.refused is None and f.canonical_name("model.language_model.norm.weight") == "norm.weight"
    assert f.is_routed_expert("layers.3.mlp.experts.5.up_proj.weight")
    assert not f.is_routed_expert("layers.3.mlp.shared_expert.up_proj.weight")
    assert families.for_config({"model_type": "qwen3_5_moe", "text_config": {"model_type": "qwen3_5_moe_text"}}) == f
    assert families.for_gguf("qwen35moe", "f.gguf") == f == families.for_gguf("qwen35", "f.gguf")


def test_state_cost_tail_and_rows(tmp_path_factory):
    cfg = open_qwen35(_dir("qwen35moe-tiny", tmp_path_factory)).config
    c = families.by_name("qwen3_5").state_cost(cfg, 0)
    # 4 GDN layers x (3 conv rows x 128 + 4 heads x 16 x 16) floats: families.md §3's 22 KiB
    assert c.fixed_bytes() == 4 * 4 * (3 * 128 + 4 * 16 * 16) == 22528
    assert c.per_token == 4 * (2 * 2 * 2 * 32 + 1)   # 2 attention layers' K and V rows, and the id
    assert c.bytes_at(0) == 4 * 512
    assert c.bytes_at(100) == 22528 + 100 * c.per_token + 4 * 512
    assert c.bytes_at(1) == 4 * (4 * (128 + 1024) + 2 * 128 + 1 + 512)   # one conv row so far
    assert c.group_bytes() == 4 * 2 * 64 * 128 and c.journal_bytes(5) == 0
    assert c.snapshot_bytes_at(100) > c.bytes_at(100) and c.resident_at(1) >= c.bytes_at(1)


def test_bf16_directory_is_packed_as_bf16_and_computes_as_its_widened_weights(tmp_path, tmp_path_factory):
    _, f32 = kernel_weights(open_qwen35(_dir("qwen35-tiny", tmp_path_factory)))
    md = open_qwen35(make_model("qwen35-tiny", SEED, tmp_path / "bf16", dtype="bfloat16"))
    assert {i.dtype for i in md.tensors.values()} == {"BF16"}
    cfg, w = kernel_weights(md)
    widened = {}
    for name, a in f32.items():
        bits, tag = w[name]
        assert tag == "BF16" and not bits.flags.owndata             # a view of the file's map
        assert np.array_equal(bits, to_bf16_bits(a)), name
        widened[name] = (bits.astype(np.uint32) << 16).view(np.float32)
    model = K.Qwen35Model(cfg, w)
    # every matrix in BF16 panels (half the bytes); the embedding (tied head's source) decoded for lookups
    assert set(model.panel_formats) == {"BF16"}
    plain = K.Qwen35Model(cfg, widened)
    assert set(plain.panel_formats) == {"F32"}
    np.testing.assert_array_equal(model.forward(TOKENS, chunk=9), plain.forward(TOKENS))


def _fp8_dequantized(w: dict) -> dict:
    """FP8 codes x their BF16 block scales in numpy (the e4m3fn table), everything else widened: the
    release's weights as fp32."""
    from cairn.daemon.modelgen.quantize import _E4M3

    table = np.concatenate([_E4M3, [480.0]])   # the NaN pattern 0x7f reads as the finite 480 its bits spell
    out = {}
    for name, v in w.items():
        if name.endswith("_scale_inv"):
            continue
        if isinstance(v, tuple) and v[1] == "F8_E4M3":
            c = v[0]
            q = np.where(c & 0x80, -table[c & 0x7F], table[c & 0x7F]).astype(np.float32)
            bits, _ = w[name + "_scale_inv"]
            s = (bits.astype(np.uint32) << 16).view(np.float32)
            v = q * np.repeat(np.repeat(s, 128, 0), 128, 1)[:q.shape[0], :q.shape[1]]
        elif isinstance(v, tuple):
            v = (v[0].astype(np.uint32) << 16).view(np.float32)
        out[name] = np.ascontiguousarray(v)
    return out


def test_fp8_release_layout_is_packed_as_fp8_and_computes_as_its_dequantized_weights(tmp_path, tmp_path_factory):
    """Qwen's FP8 layout (e4m3fn codes, a BF16 scale per 128 x 128 block in `<name>_scale_inv`, the
    release's BF16 modules) as `make-model --dtype fp8` writes it: every FP8 matrix is packed as its codes
    and scales; the logits equal fp32 panels on the dequantized weights bit for bit, and HF's on them."""
    d = make_model("qwen35moe-tiny", SEED, tmp_path / "fp8", dtype="fp8")
    md = open_qwen35(d)
    cfg, w = kernel_weights(md)
    fp8 = [n for n, v in w.items() if isinstance(v, tuple) and v[1] == "F8_E4M3"]
    assert set(fp8) == {n for n in w if fp8_quantized("model." + n)} and all(n + "_scale_inv" in w for n in fp8)
    assert len(fp8) == 4 * 3 + 2 * 4 + 6 * 3 * (8 + 1)   # 4 GDN (qkv, z, out), 2 attention (q, k, v, o), 6 MoE (8 experts + shared)
    model = K.Qwen35Model(cfg, w)
    assert model.panel_formats["F8_E4M3"] == len(fp8) - len([n for n in fp8 if n.endswith("up_proj.weight")])
    plain = _fp8_dequantized(w)
    ref = K.Qwen35Model(cfg, plain)
    assert set(ref.panel_formats) == {"F32"}
    got = model.forward(TOKENS, chunk=11)
    np.testing.assert_array_equal(got, ref.forward(TOKENS))
    # HF on the same weights (a float32 directory of them)
    h = tmp_path / "hf"
    h.mkdir()
    for f in d.iterdir():
        if f.suffix != ".safetensors" and f.is_file():
            (h / f.name).write_bytes(f.read_bytes())
    conf = json.loads((h / "config.json").read_text())
    del conf["quantization_config"]
    (h / "config.json").write_text(json.dumps(conf))
    save_file({(n if n == "lm_head.weight" else "model." + n): a for n, a in plain.items()}, h / "model.safetensors")
    assert np.abs(got - hf_logits(h, TOKENS)).max() <= TOL


def test_fp8_files_are_checked(tmp_path):
    d = make_model("qwen35moe-tiny", 0, tmp_path / "noq", dtype="fp8")
    conf = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({k: v for k, v in conf.items() if k != "quantization_config"}))
    with pytest.raises(ModelDirError, match=r"is F8_E4M3 but config.json has no FP8 quantization_config"):
        open_qwen35(d)
    (d / "config.json").write_text(json.dumps({**conf, "quantization_config": {
        **conf["quantization_config"], "weight_block_size": [64, 64]}}))
    with pytest.raises(ModelDirError, match=r"quantization_config.weight_block_size is \[64, 64\]; cairn reads "
                                            r"Qwen3.5's FP8 releases \(\[128, 128\]\)"):
        open_qwen35(d)
    (d / "config.json").write_text(json.dumps(conf))
    from safetensors.torch import load_file as load_torch, save_file as save_torch   # BF16 tensors

    f = d / "model.safetensors"
    t = load_torch(f)
    del t["model.layers.2.self_attn.q_proj.weight_scale_inv"]
    save_torch(t, f)
    with pytest.raises(ModelDirError, match=r"missing tensor\(s\) layers\.2\.self_attn\.q_proj\.weight_scale_inv"):
        open_qwen35(d)
