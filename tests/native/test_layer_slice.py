"""A slice that does not start at layer 0 (`make-model --first-layer K --layers N`) loads in the kernel
and in HF transformers, with the same per-layer schedule in both: a hash-routed first layer before a
top-k one (as V4-Flash's layers 2-3), attention kinds from the middle of the preset."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from hf_oracle import torch  # noqa: F401  (a missing oracle is an ImportError that says how to install it)
from transformers import DeepseekV4ForCausalLM  # noqa: E402

import cairn._kernel as K  # noqa: E402
from cairn.daemon.modelgen.make_model import PRESETS, make_model  # noqa: E402
from cairn.daemon.weights.model_dir import load_model, open_model_dir  # noqa: E402

TOL = 1e-4   # the fp32 parity tolerance of tests/native/test_parity.py


def test_slice_from_layer_1_matches_hf(tmp_path):
    """tiny's layers 1-2 (CSA hash-routed, HCA top-k; window 16, HCA rate 16, so 300 tokens cross
    every boundary): HF builds the same routers and its logits match the kernel's."""
    d = make_model("tiny", 5, tmp_path / "m", first_layer=1, layers=2)
    md = open_model_dir(d)
    assert md.config["layer_types"] == list(PRESETS["tiny"].layer_types[1:3])
    assert md.config["mlp_layer_types"] == ["hash_moe", "moe"]
    hf, info = DeepseekV4ForCausalLM.from_pretrained(d, dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert [layer.mlp.is_hash for layer in hf.model.layers] == [True, False]
    assert [layer.self_attn.layer_type for layer in hf.model.layers] == md.config["layer_types"]
    prompt = np.random.default_rng(3).integers(0, 512, 300).astype(np.int32)
    with torch.no_grad():
        ref = hf.eval()(input_ids=torch.tensor(prompt[None].astype(np.int64)), use_cache=False).logits[0].numpy()
    n, logits = K.prefill(K.State(load_model(md, threads=2)), prompt, chunk=64, all_logits=True)
    assert n == 300
    diff = np.abs(logits - ref).max(axis=1)
    assert diff.max() <= TOL, f"max |dlogit| {diff.max():.3g} first at position {int(np.argmax(diff > TOL))}"


def test_cli_writes_flash_layers_2_and_3_that_the_kernel_runs(tmp_path):
    """Through the CLI, V4-Flash's structure at toy width (flash-shape: 256 FP4 experts top-6, the
    official sharded layout): --first-layer 2 --layers 2 gives V4-Flash's layers 2 and 3."""
    out = tmp_path / "m"
    cairn = Path(sys.executable).with_name("cairn")
    r = subprocess.run([str(cairn), "make-model", "--preset", "flash-shape", "--first-layer", "2", "--layers", "2",
                        str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    md = open_model_dir(out)
    flash = PRESETS["flash-slice"]
    assert md.config["layer_types"] == list(flash.layer_types[2:4]) == [
        "compressed_sparse_attention", "heavily_compressed_attention"]
    assert md.config["mlp_layer_types"] == list(flash.mlp_layer_types[2:4]) == ["hash_moe", "moe"]
    assert "layers.0.ffn.gate.tid2eid" in md.tensors and "layers.1.ffn.gate.bias" in md.tensors
    assert "layers.0.attn.indexer.wq_b.weight" in md.tensors and "layers.1.attn.compressor.ape" in md.tensors
    st = K.State(load_model(md, threads=2))
    n, logits = K.prefill(st, np.arange(100, 400, dtype=np.int32), chunk=64)
    assert n == 300 and np.isfinite(logits).all()
