"""HF transformers is the oracle for generated directories: it must load what `cairn make-model`
writes (weights and tokenizer) unchanged, and the weight scales must keep logits sane at 16k.

The 16k check runs HF's eager attention in 1024-token chunks against its own cache: one 16k
forward materialises 16k x 16k score matrices (13 GB, ~100 s here); chunked it runs in about
half a minute on 2 cores. The first chunk is compared against a plain full forward so the
chunked path is known to compute the same thing.
"""

from __future__ import annotations

import numpy as np
import pytest

from hf_oracle import torch  # noqa: F401  (a missing oracle is an ImportError that says how to install it)
from transformers import AutoTokenizer, DeepseekV4ForCausalLM, DynamicCache  # noqa: E402

from cairn.daemon.protocol.chat_encoding import choose_renderer  # noqa: E402
from cairn.daemon.protocol.dsv4.encoding import ChatOptions  # noqa: E402
from cairn.daemon.modelgen.make_model import _corpus, make_model  # noqa: E402
from cairn.daemon.weights.model_dir import open_model_dir  # noqa: E402
from cairn.daemon.protocol.tokenizer import TextTokenizer  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_model("tiny", 11, tmp_path_factory.mktemp("tiny-hf"))


@pytest.fixture(scope="module")
def hf(tiny):
    model, info = DeepseekV4ForCausalLM.from_pretrained(tiny, dtype=torch.float32, output_loading_info=True)
    return model.eval(), info


@pytest.fixture(scope="module")
def tok(tiny):
    return TextTokenizer.from_model_dir(open_model_dir(tiny))


def _text_tokens(tok: TextTokenizer, n: int) -> list[int]:
    ids = tok.encode("\n".join(_corpus(max(1000, n))))
    assert len(ids) >= n
    return ids[:n]


def test_hf_loads_every_tensor_and_gives_finite_logits(hf, tok):
    model, info = hf
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert not info["mismatched_keys"] and not info["error_msgs"]
    ids = torch.tensor([_text_tokens(tok, 300)])
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0]
    assert logits.shape == (300, 512)
    assert torch.isfinite(logits).all()
    assert 0.3 <= float(logits.std()) <= 3


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_hf_loads_reduced_precision_dirs(tmp_path, dtype):
    d = make_model("tiny", 11, tmp_path, dtype=dtype, shard_bytes=300_000)
    model, info = DeepseekV4ForCausalLM.from_pretrained(d, dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]


def test_autotokenizer_agrees_with_ours(tiny, tok):
    hf_tok = AutoTokenizer.from_pretrained(tiny)
    assert (hf_tok.bos_token_id, hf_tok.eos_token_id, len(hf_tok)) == (tok.bos_id, tok.eos_id, tok.vocab_size)
    text = "héllo ✓ 日本 the model<｜User｜>read a file<｜Assistant｜>"
    assert hf_tok.encode(text, add_special_tokens=False) == tok.encode(text)
    assert hf_tok.decode(tok.encode(text)) == text


def test_hf_renders_and_tokenizes_the_v4_encoding_as_we_do(tiny, tok):
    # cairn serves generated directories with the native V4 encoder; the jinja template make-model
    # writes must render the same text in HF, and HF's tokenizer must read it into the same ids,
    # V4's special tokens whole.
    md = open_model_dir(tiny)
    hf_tok = AutoTokenizer.from_pretrained(tiny)
    tools = [{"type": "function", "function": {"name": "read", "description": "lit ✓",
                                               "parameters": {"type": "object", "properties": {}}}}]
    messages = [
        {"role": "system", "content": "Tu es bref. 日本"},
        {"role": "user", "content": "lis a.txt"},
        {"role": "assistant", "content": "", "reasoning_content": "il faut lire", "tool_calls": [
            {"type": "function", "function": {"name": "read", "arguments": {"path": "a.txt"}}}]},
        {"role": "tool", "content": "contenu"},
        {"role": "user", "content": "merci"},
    ]
    choice = choose_renderer(md)
    assert choice.encoding == "deepseek-v4 native"
    text = choice.renderer.render(messages, tools=tools, options=ChatOptions(thinking=True)).text
    assert hf_tok.apply_chat_template(messages, tools=tools, tokenize=False, thinking=True) == text
    ids = hf_tok.encode(text, add_special_tokens=False)
    assert ids == tok.encode(text)
    for special in ("<think>", "</think>", "｜DSML｜", "<｜User｜>", "<｜Assistant｜>"):
        assert hf_tok.convert_tokens_to_ids(special) in ids


def test_logits_stay_finite_and_non_degenerate_over_16k_tokens(hf, tok):
    model, _ = hf
    n, chunk = 16384, 1024
    ids = torch.tensor([_text_tokens(tok, n)])
    cache = DynamicCache(config=model.config)
    stats = []
    with torch.no_grad():
        reference = model(input_ids=ids[:, :chunk], use_cache=False).logits[0]
        for start in range(0, n, chunk):
            out = model(input_ids=ids[:, start:start + chunk], cache=cache, use_cache=True)
            logits = out.logits[0]
            if start == 0:
                torch.testing.assert_close(logits, reference, rtol=1e-4, atol=1e-4)
            assert torch.isfinite(logits).all(), f"non-finite logits in positions {start}..{start + chunk}"
            stats.append((start, float(logits.std()), int(logits.argmax(-1).unique().numel())))
    for start, std, distinct in stats:
        assert 0.3 <= std <= 3, f"logit std {std:.3f} at positions {start}..{start + chunk}"
        assert distinct > 1, f"argmax constant at positions {start}..{start + chunk}"
    assert np.mean([d for _, _, d in stats[-4:]]) > 8  # the far end still discriminates between tokens


_RAW = {"model_type": "deepseek_v4", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 5,
        "num_attention_heads": 4, "head_dim": 128}


@pytest.mark.parametrize("extra", [
    {},
    {"compress_ratios": [0, 4, 128, 4, 0], "num_hash_layers": 2, "qk_rope_head_dim": 32},
    {"rope_theta": 20000.0, "compress_rope_theta": 80000.0,
     "rope_scaling": {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096,
                      "beta_fast": 16, "beta_slow": 2}},
    {"partial_rotary_factor": 0.5, "compress_rates": {"compressed_sparse_attention": 8,
                                                      "heavily_compressed_attention": 64}},
], ids=["defaults", "legacy-names", "flat-yarn", "rates"])
def test_resolve_config_reads_configs_as_hf_does(extra):
    from transformers import DeepseekV4Config

    from cairn.daemon.weights.dsv4.config import resolve_config

    raw = _RAW | extra
    ours = resolve_config(raw)
    hf_raw = {k: v for k, v in raw.items() if k != "model_type"}
    if "rope_scaling" in hf_raw:
        hf_raw["rope_parameters"] = hf_raw.pop("rope_scaling")
        hf_raw["rope_parameters"]["rope_type"] = hf_raw["rope_parameters"].pop("type")
    c = DeepseekV4Config(**hf_raw)
    main, comp = c.rope_parameters["main"], c.rope_parameters["compress"]
    assert ours["qk_rope_head_dim"] == c.qk_rope_head_dim
    assert ours["layer_types"] == list(c.layer_types) and ours["mlp_layer_types"] == list(c.mlp_layer_types)
    assert (ours["csa_rate"], ours["hca_rate"]) == (c.compress_rates["compressed_sparse_attention"],
                                                    c.compress_rates["heavily_compressed_attention"])
    assert (ours["rope_theta"], ours["compress_rope_theta"]) == (main["rope_theta"], comp["rope_theta"])
    assert ours["compress_rope_type"] == comp["rope_type"]
    if comp["rope_type"] == "yarn":
        assert (ours["yarn_factor"], ours["yarn_original_max_position_embeddings"], ours["yarn_beta_fast"],
                ours["yarn_beta_slow"]) == (comp["factor"], comp["original_max_position_embeddings"],
                                            comp["beta_fast"], comp["beta_slow"])
