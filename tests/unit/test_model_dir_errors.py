"""Broken model directories fail at open with a message that says what to fix."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from cairn.daemon.modelgen.make_model import make_model
from cairn.daemon.weights.model_dir import ModelDirError, open_model_dir
from cairn.daemon.weights.safetensors_io import map_tensor, read_header, write_file
from cairn.daemon.protocol.tokenizer import TextTokenizer


@pytest.fixture
def model(tmp_path):
    return make_model("tiny", 1, tmp_path / "m")


def _rewrite(f, mutate):
    _, infos = read_header(f)
    tensors = {n: (np.array(map_tensor(i)), i.dtype) for n, i in infos.items()}
    mutate(tensors)
    write_file(f, tensors)


def _edit_json(f, mutate):
    data = json.loads(f.read_text())
    mutate(data)
    f.write_text(json.dumps(data))


def test_missing_tensor(model):
    _rewrite(model / "model.safetensors", lambda t: t.pop("model.layers.2.attn.compressor.ape"))
    with pytest.raises(ModelDirError, match=r"missing tensor\(s\) layers\.2\.attn\.compressor\.ape"):
        open_model_dir(model)


def test_wrong_shape_names_file_tensor_expected_and_actual(model):
    def shrink(t):
        t["model.layers.0.attn.wq_a.weight"] = (np.zeros((32, 63), np.float32), "F32")
    _rewrite(model / "model.safetensors", shrink)
    with pytest.raises(ModelDirError) as e:
        open_model_dir(model)
    msg = str(e.value)
    assert "model.safetensors" in msg and "'model.layers.0.attn.wq_a.weight'" in msg
    assert "shape [32, 63], expected [32, 64]" in msg


def test_float_tensor_where_an_integer_one_belongs(model):
    def to_float(t):
        arr, _ = t["model.layers.0.ffn.gate.tid2eid"]
        t["model.layers.0.ffn.gate.tid2eid"] = (arr.astype(np.float32), "F32")
    _rewrite(model / "model.safetensors", to_float)
    with pytest.raises(ModelDirError, match="tid2eid' has dtype F32, expected an integer dtype"):
        open_model_dir(model)


def test_unknown_model_type(model):
    _edit_json(model / "config.json", lambda c: c.update(model_type="llama"))
    with pytest.raises(ModelDirError, match=r"model_type is 'llama'; cairn serves DeepSeek-V4"):
        open_model_dir(model)


def test_unofficial_quantization_is_refused(model):
    _edit_json(model / "config.json", lambda c: c.update(quantization_config={"quant_method": "fp8"}))
    with pytest.raises(ModelDirError, match="quantization_config.scale_fmt is None; cairn supports the official"):
        open_model_dir(model)


@pytest.fixture
def qmodel(tmp_path):
    return make_model("tiny-fp4", 1, tmp_path / "q")


def test_quantized_directory_opens_with_scales_in_either_spelling(tmp_path, qmodel):
    hf = make_model("tiny-fp4", 1, tmp_path / "hf", official_names=False)
    a, b = open_model_dir(qmodel), open_model_dir(hf)
    assert a.tensors.keys() == b.tensors.keys()
    assert b.tensors["layers.1.ffn.experts.0.w1.scale"].name == "model.layers.1.ffn.experts.0.w1.weight_scale_inv"
    assert (a.tensors["layers.1.ffn.experts.0.w1.weight"].dtype, a.tensors["layers.1.ffn.experts.0.w1.weight"].shape) \
        == ("I8", (64, 128))


def test_float_scale_is_refused_naming_the_tensor(qmodel):
    def to_float(t):
        arr, _ = t["layers.0.attn.wq_a.scale"]
        t["layers.0.attn.wq_a.scale"] = (np.exp2(arr.astype(np.float32) - 127), "F32")
    _rewrite(qmodel / "model.safetensors", to_float)
    with pytest.raises(ModelDirError, match=r"'layers\.0\.attn\.wq_a\.scale' has dtype F32; only F8_E8M0"):
        open_model_dir(qmodel)


def test_missing_scale_is_refused(qmodel):
    _rewrite(qmodel / "model.safetensors", lambda t: t.pop("layers.2.ffn.experts.3.w2.scale"))
    with pytest.raises(ModelDirError, match=r"'layers\.2\.ffn\.experts\.3\.w2\.weight' \(I8\) has no block scale"):
        open_model_dir(qmodel)


def test_wrong_scale_grid_is_refused(qmodel):
    def shrink(t):
        t["layers.0.attn.wq_b.scale"] = (np.full((1, 1), 120, np.uint8), "F8_E8M0")
    _rewrite(qmodel / "model.safetensors", shrink)
    with pytest.raises(ModelDirError, match=r"'layers\.0\.attn\.wq_b\.scale' has shape \[1, 1\], expected \[2, 1\]"):
        open_model_dir(qmodel)


def test_fp4_outside_the_routed_experts_is_refused(qmodel):
    def fp4(t):
        t["layers.0.attn.wq_a.weight"] = (np.zeros((128, 128), np.int8), "I8")
    _rewrite(qmodel / "model.safetensors", fp4)
    with pytest.raises(ModelDirError, match=r"'layers\.0\.attn\.wq_a\.weight' is I8 \(FP4\); only routed experts"):
        open_model_dir(qmodel)


def test_quantized_tensor_without_quantization_config_is_refused(qmodel):
    _edit_json(qmodel / "config.json", lambda c: c.pop("quantization_config"))
    with pytest.raises(ModelDirError, match="has dtype F8_E4M3 but config.json has no quantization_config"):
        open_model_dir(qmodel)


def test_missing_config(model):
    (model / "config.json").unlink()
    with pytest.raises(ModelDirError, match="config.json: missing"):
        open_model_dir(model)


def test_no_tokenizer_json(model):
    (model / "tokenizer.json").unlink()
    with pytest.raises(ModelDirError, match="missing tokenizer.json"):
        open_model_dir(model)


def test_unreadable_tokenizer_json(model):
    (model / "tokenizer.json").write_text('{"version": "1.0", "model": 3}')
    md = open_model_dir(model)
    with pytest.raises(ModelDirError, match="tokenizer.json: cannot load tokenizer"):
        TextTokenizer.from_model_dir(md)


def test_no_chat_template_means_the_native_v4_encoding(model):
    # The first DeepSeek-V4 release shipped no template; such a directory is served, natively.
    from cairn.daemon.protocol.chat_encoding import choose_renderer

    assert "renders as the V4 encoding" in choose_renderer(open_model_dir(model)).reason   # make-model's own
    _edit_json(model / "tokenizer_config.json", lambda c: c.pop("chat_template"))
    md = open_model_dir(model)
    assert md.chat_template is None
    choice = choose_renderer(md)
    assert choice.encoding == "deepseek-v4 native" and "no chat template" in choice.reason


def test_truncated_safetensors_header(model):
    f = model / "model.safetensors"
    f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(ModelDirError, match=r"model\.safetensors: truncated or corrupt safetensors header"):
        open_model_dir(model)


def test_truncated_tensor_data(model):
    f = model / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) - 1000])
    with pytest.raises(ModelDirError, match="data is truncated or mis-sized"):
        open_model_dir(model)


def test_missing_shard_listed_in_the_index(tmp_path):
    d = make_model("tiny", 1, tmp_path / "m", shard_bytes=400_000)
    shards = sorted(d.glob("model-*.safetensors"))
    assert len(shards) >= 3
    shards[1].unlink()
    with pytest.raises(ModelDirError, match="lists shard\\(s\\) that do not exist: " + re.escape(shards[1].name)):
        open_model_dir(d)


def test_no_weights(model):
    (model / "model.safetensors").unlink()
    with pytest.raises(ModelDirError, match="no weights"):
        open_model_dir(model)


def test_not_a_directory(tmp_path):
    with pytest.raises(ModelDirError, match="model directory does not exist"):
        open_model_dir(tmp_path / "nope")


def test_config_that_is_not_an_object_is_a_clear_error(tmp_path):
    import shutil

    from cairn.daemon.modelgen.make_model import make_model
    from cairn.daemon.weights.model_dir import ModelDirError, open_model_dir

    d = make_model("tiny", 0, tmp_path / "m")
    (d / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelDirError, match="config.json: expected a JSON object, got list"):
        open_model_dir(d)
    shutil.rmtree(d)
