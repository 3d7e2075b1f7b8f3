"""GGUF fixtures (tests/fixtures/gguf/, llama.cpp's converter on `make_model("gguf-tiny", 0, dtype=...)`)
through the kernel: logits bit-identical to the same model loaded from its safetensors directory
(F32, split F32, and the BF16/F16 conversions, whose matrices the kernel takes as stored), and within
the directory tolerance of HF transformers on those (bf16/fp16-rounded) weights."""

import json
from pathlib import Path

import numpy as np
import pytest

import cairn._kernel as K

from cairn.daemon.modelgen.make_model import make_model
from cairn.daemon.weights import model_dir
from hf_oracle import torch  # a missing oracle is an ImportError that says how to install it

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "gguf"
# the float fixtures (the gguf-quant-* ones: tests/unit/test_gguf_quant.py)
MANIFEST = {k: v for k, v in json.loads((FIX / "MANIFEST.json").read_text())["fixtures"].items()
            if v["preset"] == "gguf-tiny"}
FIRST = {"gguf-tiny-f32": "gguf-tiny-f32.gguf", "gguf-tiny-bf16": "gguf-tiny-bf16.gguf",
         "gguf-tiny-f16": "gguf-tiny-f16.gguf", "gguf-tiny-split": "gguf-tiny-split-00001-of-00003.gguf"}
TOKENS = np.random.default_rng(1).integers(0, 512, 300).astype(np.int32)   # past the HCA rate (128) twice


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf_src")
    return {dt: make_model("gguf-tiny", 0, root / dt / "gguf-tiny", dtype=dt)
            for dt in {m["dtype"] for m in MANIFEST.values()}}


def logits(model, chunk):
    n, out = K.prefill(K.State(model), TOKENS, chunk=chunk, all_logits=True)
    assert n == len(TOKENS)
    return out


@pytest.mark.parametrize("stem", list(FIRST))
def test_gguf_logits_are_bit_identical_to_the_safetensors_directorys(stem, sources):
    src = sources[MANIFEST[stem]["dtype"]]
    g = model_dir.load_model(FIX / FIRST[stem], threads=2)
    d = model_dir.load_model(src, threads=2)
    assert g.fingerprint != d.fingerprint                          # two sources, one model
    for chunk in (37, 128):
        a, b = logits(g, chunk), logits(d, chunk)
        assert np.array_equal(a, b), f"chunk {chunk}: max |diff| {np.abs(a - b).max()}"


@pytest.mark.parametrize("stem", ["gguf-tiny-f32", "gguf-tiny-bf16", "gguf-tiny-f16"])
def test_gguf_matches_hf_on_the_same_weights(stem, sources):
    from transformers import DeepseekV4ForCausalLM

    hf = DeepseekV4ForCausalLM.from_pretrained(sources[MANIFEST[stem]["dtype"]], dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(TOKENS[None].astype(np.int64)), use_cache=False).logits[0].numpy()
    g = model_dir.load_model(FIX / FIRST[stem], threads=2)
    assert np.abs(logits(g, 64) - ref).max() <= 1e-4
