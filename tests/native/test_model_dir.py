"""End to end through the real loader: `cairn make-model` directory -> load_model -> kernel,
against HF loading the same directory (fp32, bf16 and fp16 weights)."""

import numpy as np
import pytest

import cairn._kernel as K

from cairn.daemon.modelgen import make_model
from cairn.daemon.weights import model_dir
from hf_oracle import torch  # a missing oracle is an ImportError that says how to install it


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_model_dir_matches_hf(tmp_path, dtype):
    from transformers import DeepseekV4ForCausalLM

    make_model.make_model("tiny", 5, tmp_path / "m", dtype=dtype)
    m = model_dir.load_model(tmp_path / "m", threads=2)
    hf = DeepseekV4ForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.float32).eval()
    tokens = np.random.default_rng(1).integers(0, m.vocab_size, 300).astype(np.int32)
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(tokens[None].astype(np.int64)), use_cache=False).logits[0].numpy()
    for chunk in (37, 128):
        n, logits = K.prefill(K.State(m), tokens, chunk=chunk, all_logits=True)
        assert n == len(tokens)
        assert np.abs(logits - ref).max() <= 1e-4
