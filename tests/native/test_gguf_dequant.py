"""The oracle input for quantized GGUF files (scripts/dequantize_gguf.py): the HF-style F32 directory a GGUF
stands for. An F32 GGUF gives back the directory it was converted from (weights, config, tokenizer, template:
HF's logits identical); each quantized fixture gives a directory HF's DeepseekV4ForCausalLM loads whole
(no missing or unexpected weight) and on which cairn's fp32 path matches HF as on any model directory."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import cairn._kernel as K

from cairn.daemon.modelgen.make_model import make_model
from cairn.daemon.weights import model_dir
from hf_oracle import torch  # a missing oracle is an ImportError that says how to install it

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
from dequantize_gguf import dequantized_model_dir  # noqa: E402

FIX = REPO / "tests" / "fixtures" / "gguf"
QUANT = sorted(s for s in json.loads((FIX / "MANIFEST.json").read_text())["fixtures"] if s.startswith("gguf-quant-"))
TEXT = ["def fetch(url: str, *, retries: int = 3) -> bytes:", "héllo wörld ✓ 日本語 🙂 3.14159 -42",
        "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜><think>x</think>"]


def hf_logits(path: Path, tokens: np.ndarray) -> np.ndarray:
    from transformers import DeepseekV4ForCausalLM

    hf, info = DeepseekV4ForCausalLM.from_pretrained(path, dtype=torch.float32, output_loading_info=True)
    assert not any(info.values()), info      # every weight the model has came from the directory
    with torch.no_grad():
        return hf.eval()(input_ids=torch.tensor(tokens[None].astype(np.int64)), use_cache=False).logits[0].numpy()


def test_an_f32_gguf_dequantizes_to_the_directory_it_was_converted_from(tmp_path):
    from transformers import AutoTokenizer

    src = make_model("gguf-tiny", 0, tmp_path / "src" / "gguf-tiny")
    d = dequantized_model_dir(FIX / "gguf-tiny-f32.gguf", tmp_path / "deq")
    a, b = model_dir.open_model_dir(d), model_dir.open_model_dir(src)
    assert a.config == b.config and a.chat_template == b.chat_template
    wa, wb = model_dir.map_weights(a), model_dir.map_weights(b)
    assert set(wa) == set(wb)
    assert all(wa[k][1] == wb[k][1] and np.array_equal(wa[k][0], wb[k][0]) for k in wb)
    ta, tb = AutoTokenizer.from_pretrained(d), AutoTokenizer.from_pretrained(src)
    for line in TEXT:
        assert ta(line).input_ids == tb(line).input_ids, line
    assert (ta.bos_token, ta.eos_token, ta.pad_token) == (tb.bos_token, tb.eos_token, tb.pad_token)
    chat = [{"role": "user", "content": "hi"}]
    assert ta.apply_chat_template(chat, tokenize=False) == tb.apply_chat_template(chat, tokenize=False)
    tokens = np.random.default_rng(1).integers(0, 512, 200)
    assert np.array_equal(hf_logits(d, tokens), hf_logits(src, tokens))


@pytest.mark.parametrize("stem", QUANT)
def test_hf_loads_the_dequantized_fixture_and_cairns_fp32_path_matches_it(stem, tmp_path):
    from gguf import GGUFReader
    from gguf.quants import dequantize

    gguf = FIX / f"{stem}.gguf"
    d = dequantized_model_dir(gguf, tmp_path / stem)
    md = model_dir.open_model_dir(d)
    assert md.config == model_dir.open_model_dir(gguf).config
    w = model_dir.map_weights(md)
    assert all(tag in ("F32", "I64") for _, tag in w.values())
    # the stacked experts, decoded by the reader, are the per-expert weights
    down = next(t for t in GGUFReader(gguf).tensors if t.name == "blk.0.ffn_down_exps.weight")
    full = dequantize(np.asarray(down.data), down.tensor_type)
    for e in range(full.shape[0]):
        assert np.array_equal(w[f"layers.0.ffn.experts.{e}.w2.weight"][0], full[e])
    tokens = np.random.default_rng(2).integers(0, md.config["vocab_size"], 200).astype(np.int32)
    ref = hf_logits(d, tokens)
    n, got = K.prefill(K.State(model_dir.load_model(md, threads=2)), tokens, chunk=64, all_logits=True)
    assert n == len(tokens) and np.abs(got - ref).max() <= 1e-4


@pytest.mark.parametrize("stem", QUANT)
def test_the_quantized_file_computes_the_bits_of_fp32_on_its_dequantized_weights(stem, tmp_path):
    """The file served as stored (GGUF blocks in the kernel's panels) against cairn's fp32 path on the
    directory gguf.quants.dequantize makes of it: all-position logits for several chunkings, decode,
    and decode after a snapshot restore, bit for bit."""
    gguf = FIX / f"{stem}.gguf"
    fp32 = model_dir.load_model(model_dir.open_model_dir(dequantized_model_dir(gguf, tmp_path / stem)), threads=2)
    quant = model_dir.load_model(model_dir.open_model_dir(gguf), threads=2)
    assert quant.packed_bytes < fp32.packed_bytes / 2           # the panels hold the stored blocks
    tokens = np.random.default_rng(3).integers(0, 320, 160).astype(np.int32)
    ref = K.prefill(K.State(fp32), tokens, chunk=160, all_logits=True)[1]
    for chunk in (160, 37, 1):
        got = K.prefill(K.State(quant), tokens, chunk=chunk, all_logits=True)[1]
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), f"chunk {chunk}"
    sq, sf = K.State(quant), K.State(fp32)
    K.prefill(sq, tokens[:100], chunk=64)
    K.prefill(sf, tokens[:100], chunk=64)
    snap = sq.snapshot()
    want = [K.decode(sf, int(t)) for t in tokens[100:108]]
    assert all(np.array_equal(K.decode(sq, int(t)), w) for t, w in zip(tokens[100:108], want))
    restored = K.State.restore(quant, snap)
    assert all(np.array_equal(K.decode(restored, int(t)), w) for t, w in zip(tokens[100:108], want))
