"""Quantized GGUF fixtures (tests/fixtures/gguf/gguf-quant-*.gguf: llama-quantize on the F32 conversion of
`make_model("gguf-quant", 0)`, scripts/make_gguf_fixtures.py) through the loader: each block-quantized
tensor is tagged `GGML:<TYPE>` and mapped, uncopied, as uint8 [rows..., row_bytes]; the routed experts
are views of their stacked tensor; the MANIFEST says which types each file holds; a type cairn does not
load, or a row that is not whole blocks, is refused by name. (The oracle directory: scripts/dequantize_gguf.py,
tests/native/test_gguf_dequant.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

from cairn.daemon.modelgen.make_model import make_model
from cairn.daemon.weights import ggml_types
from cairn.daemon.weights.dsv4.gguf import gguf_name
from cairn.daemon.weights.model_dir import ModelDirError, map_weights, open_model_dir
from cairn.daemon.weights.safetensors_io import FileMaps

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "gguf"
MANIFEST = json.loads((FIX / "MANIFEST.json").read_text())["fixtures"]
QUANT = sorted(stem for stem in MANIFEST if stem.startswith("gguf-quant-"))
# every quantized type the loader takes, in GGML type order
LOADED = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS",
          "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "IQ1_M", "MXFP4"]
FLOATS = {"F32", "F16", "BF16"}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """The directory the quantized fixtures came from (make_model is deterministic)."""
    m = MANIFEST[QUANT[0]]
    return make_model(m["preset"], m["seed"], tmp_path_factory.mktemp("gq") / m["preset"])


def stacked_name(tensor_name: str) -> tuple[str, int | None]:
    """A TensorInfo name -> (GGUF tensor name, expert index or None)."""
    if tensor_name.endswith("]"):
        base, e = tensor_name[:-1].split("[")
        return base, int(e)
    return tensor_name, None


def test_the_fixture_set_covers_every_loaded_type():
    held = set().union(*(set(MANIFEST[s]["type_counts"]) for s in QUANT))
    assert held - FLOATS == set(LOADED)


@pytest.mark.parametrize("stem", QUANT)
def test_manifest_records_the_types_the_file_holds(stem):
    entry = MANIFEST[stem]
    types = {t.name: t.tensor_type.name for t in GGUFReader(FIX / f"{stem}.gguf").tensors}
    assert entry["tensor_types"] == types
    counts: dict[str, int] = {}
    for t in types.values():
        counts[t] = counts.get(t, 0) + 1
    assert entry["type_counts"] == counts
    assert (FIX / f"{stem}.gguf").stat().st_size <= 2_000_000


def test_quant_types_are_ggmls_and_the_kernels():
    for name, gtype, block, nbytes in ggml_types.QUANT_TYPES:
        assert GGMLQuantizationType[name].value == gtype
        assert GGML_QUANT_SIZES[GGMLQuantizationType[name]] == (block, nbytes)
    assert [t[0] for t in ggml_types.QUANT_TYPES] == LOADED
    import cairn._kernel as K

    # the loader accepts what the kernel decodes in blocks (F32/F16/BF16 load as float types)
    want = sorted(tuple(t) for t in K.codec_types() if t[2] > 1)
    assert sorted((n, *v) for n, v in ggml_types.SUPPORTED.items()) == want == sorted(ggml_types.QUANT_TYPES)


@pytest.mark.parametrize("stem", QUANT)
def test_weights_are_ggml_rows_mapped_in_place(stem, source):
    path = FIX / f"{stem}.gguf"
    g = open_model_dir(path)
    assert g.config == open_model_dir(source).config
    maps = FileMaps()
    w = map_weights(g, maps)
    whole = np.frombuffer(maps._map(path), np.uint8)
    reader = {t.name: t for t in GGUFReader(path).tensors}
    types = MANIFEST[stem]["tensor_types"]
    seen = set()
    for name, (arr, tag) in w.items():
        info = g.tensors[name]
        gname, expert = stacked_name(info.name)
        seen.add(gname)
        gtype = types[gname]
        logical = info.shape
        if gtype in FLOATS or name.endswith("tid2eid"):
            assert tag == gtype or (name.endswith("tid2eid") and tag in ("I32", "I64")), name
            assert arr.shape == logical
        else:
            block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[gtype]]
            assert tag == f"GGML:{gtype}", name
            assert arr.dtype == np.uint8 and arr.shape == (*logical[:-1], logical[-1] // block * nbytes), name
        assert arr.nbytes == info.end - info.start, name
        # no copy: a read-only view of the file's one map, at the tensor's offset
        assert not arr.flags.owndata and not arr.flags.writeable, name
        base = arr
        while isinstance(base, np.ndarray):
            base = base.base
        assert isinstance(base, memoryview) and base.obj is maps._map(path), name
        assert arr.ctypes.data - whole.ctypes.data == info.start, name
        stored = np.asarray(reader[gname].data)
        stored = stored if expert is None else stored[expert]
        assert np.array_equal(arr.view(np.uint8).reshape(-1), stored.view(np.uint8).reshape(-1)), name
    # every GGUF tensor is used (the one-layer model has no MTP block or vision bias)
    assert seen == set(reader)


@pytest.mark.parametrize("stem", QUANT)
def test_each_tensor_decodes_near_its_source_weight(stem, source):
    """The bytes behind each canonical name are that weight's (experts in order): decoded, they are within
    the type's quantization error of the source; any other weight of the shape is ~1.4x its norm away."""
    w = map_weights(open_model_dir(FIX / f"{stem}.gguf"))
    src = map_weights(open_model_dir(source))
    worst = 0.0
    for name, (arr, tag) in w.items():
        want = np.asarray(src[name][0], np.float64)
        if not tag.startswith("GGML:"):
            assert np.array_equal(arr, src[name][0]), name
            continue
        got = dequantize(np.ascontiguousarray(arr), GGMLQuantizationType[tag[5:]]).astype(np.float64)
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        worst = max(worst, err)
        assert err < 0.6, f"{name} ({tag}): relative error {err:.3f}"
    e0, e1 = (dequantize(np.ascontiguousarray(w[f"layers.0.ffn.experts.{e}.w1.weight"][0]),
                         GGMLQuantizationType[w["layers.0.ffn.experts.0.w1.weight"][1][5:]]) for e in (0, 1))
    want0 = src["layers.0.ffn.experts.0.w1.weight"][0]
    assert np.linalg.norm(e1 - want0) / np.linalg.norm(want0) > 1.2 > np.linalg.norm(e0 - want0) / np.linalg.norm(want0)
    assert worst > 0   # something was quantized


# --------------------------------------------------------------------------------------------
# errors and split sets


def copy_gguf(src: Path, dst: Path, edit=None, split_max_tensors: int = 0) -> Path:
    """Copy a GGUF with gguf.GGUFWriter; edit(name, stored array, type) may return (array, raw_shape,
    raw_dtype) to store instead. split_max_tensors: write a split set (dst is then its base name)."""
    r = GGUFReader(src)
    w = GGUFWriter(dst, r.fields["general.architecture"].contents(), split_max_tensors=split_max_tensors)
    for key, f in r.fields.items():
        if key.startswith(("GGUF.", "split.")) or key == "general.architecture":
            continue
        sub = f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), f.types[0], sub_type=sub)
    for t in r.tensors:
        got = edit(t.name, np.asarray(t.data), t.tensor_type) if edit else None
        if got is None:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
        else:
            arr, raw_shape, raw_dtype = got
            w.add_tensor(t.name, arr, raw_shape=raw_shape, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_a_tq2_0_tensor_is_refused_with_file_name_type_and_the_supported_list(tmp_path):
    """TQ2_0 (llama.cpp's ternary type) is not among the loaded types: refused at open, before any byte
    of it is read, so the blocks here need not be meaningful."""
    qtype = GGMLQuantizationType.TQ2_0

    def edit(name, data, stored):
        if name == "blk.0.attn_q_b.weight":
            rows, cols = dequantize(data, stored).shape
            block, nbytes = GGML_QUANT_SIZES[qtype]
            return np.zeros((rows, cols // block * nbytes), np.uint8), None, qtype
        return None

    path = copy_gguf(FIX / "gguf-quant-q4_k_m.gguf", tmp_path / "tq2_0.gguf", edit)
    with pytest.raises(ModelDirError) as e:
        open_model_dir(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: tensor 'blk.0.attn_q_b.weight' has GGML type TQ2_0;")
    assert msg.split("quantized types ", 1)[1].split(" (", 1)[0].split(", ") == LOADED
    assert "F32, F16, BF16" in msg


def test_a_row_that_is_not_whole_blocks_is_refused_by_tensor_name(tmp_path):
    """ggml requires whole blocks per row; a file that breaks it is named, not read past a row's end."""
    def edit(name, data, qtype):
        if name == "blk.0.attn_q_b.weight":   # Q8_0 [256, 256] rewritten as 256 rows of 240 values
            return np.zeros(256 * 240 * 34 // 32, np.int8), (256, 240), GGMLQuantizationType.Q8_0
        return None

    path = copy_gguf(FIX / "gguf-quant-q8_0.gguf", tmp_path / "rows.gguf", edit)
    with pytest.raises(ModelDirError, match=r"rows.gguf: tensor 'blk.0.attn_q_b.weight' is Q8_0 with rows of "
                                            r"240 values, not a whole number of its 32-value blocks"):
        open_model_dir(path)


def test_a_quantized_split_set_gives_the_single_files_weights(tmp_path):
    one = open_model_dir(FIX / "gguf-quant-q4_k_m.gguf")
    copy_gguf(FIX / "gguf-quant-q4_k_m.gguf", tmp_path / "q.gguf", split_max_tensors=15)
    parts = sorted(tmp_path.glob("q-*-of-*.gguf"))
    assert [p.name for p in parts] == ["q-00001-of-00003.gguf", "q-00002-of-00003.gguf", "q-00003-of-00003.gguf"]
    split = open_model_dir(parts[1])
    assert split.config == one.config and len({t.file for t in split.tensors.values()}) == 3
    a, b = map_weights(one), map_weights(split)
    assert set(a) == set(b)
    for name in a:
        assert a[name][1] == b[name][1] and np.array_equal(a[name][0], b[name][0]), name


def test_unsupported_type_names_the_experts_stack_in_llama_cpp_spelling(tmp_path):
    def edit(name, data, qtype):
        if name == "blk.0.ffn_down_exps.weight":
            f32 = dequantize(data, qtype)
            return quantize(f32, GGMLQuantizationType.TQ2_0), None, GGMLQuantizationType.TQ2_0
        return None

    path = copy_gguf(FIX / "gguf-quant-mxfp4_moe.gguf", tmp_path / "tq2.gguf", edit)
    with pytest.raises(ModelDirError, match=r"tensor 'blk.0.ffn_down_exps.weight' has GGML type TQ2_0"):
        open_model_dir(path)
    assert gguf_name("layers.0.ffn.experts.1.w2.weight") == "blk.0.ffn_down_exps.weight (expert 1)"
