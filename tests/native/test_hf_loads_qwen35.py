"""HF transformers loads the Qwen3.5 directories `cairn make-model` writes (issue 43, step 3) and computes
sane, well-conditioned logits from them; their tokenizer and chat template work in HF as in the release.

The decode-vs-prefill check is what the generator's decay scales are for: HF's prefill runs the chunked
gated delta rule (chunks of 64, a triangular solve per chunk), its cached decode the per-token recurrence;
with A = exp(A_log) in [0.01, 1] and dt_bias near 0 the two agree to ~4e-7 of the outputs' scale per layer,
and the logits (std ~1) to fp32 rounding (~3e-5, most of it from the gated output norm rescaling small
outputs).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import hf_oracle_qwen35 as oracle
from hf_oracle import torch  # noqa: F401
from transformers import AutoTokenizer, DynamicCache, Qwen3_5MoeForConditionalGeneration  # noqa: E402
from transformers.models.qwen3_5 import modeling_qwen3_5  # noqa: E402
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe  # noqa: E402

from cairn.daemon.modelgen import qwen35  # noqa: E402
from cairn.daemon.modelgen.make_model import _corpus, make_model  # noqa: E402
from cairn.daemon.weights.safetensors_io import read_header  # noqa: E402

PRESETS = list(qwen35.PRESETS)
SEED = 7


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return {name: make_model(name, SEED, tmp_path_factory.mktemp(name)) for name in PRESETS}


def _text_ids(model_dir, n: int) -> list[int]:
    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = tok.encode("\n".join(_corpus(1000)), add_special_tokens=False)
    assert len(ids) >= n
    return ids[:n]


def _header(model_dir) -> dict:
    return read_header(model_dir / "model.safetensors")[1]


def _file_names(model_dir) -> set[str]:
    return set(_header(model_dir))


@pytest.mark.parametrize("preset", PRESETS)
def test_hf_loads_every_tensor_and_gives_sane_logits(dirs, preset):
    d = dirs[preset]
    model, info = oracle.load(d, with_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"] and not info["error_msgs"], info
    names = _file_names(d)
    ignored = {n for n in names if n.startswith(("model.visual.", "mtp."))}
    # HF drops the vision tower and the MTP head of a conditional-generation checkpoint by pattern
    # (`_keys_to_ignore_on_load_unexpected`); nothing else may be unexpected.
    assert set(info["unexpected_keys"]) <= ignored
    if preset == "qwen35moe-tiny-cond":
        assert any(n.startswith("model.visual.blocks.0.") for n in ignored)
        assert {"mtp.fc.weight", "mtp.norm.weight"} <= ignored
        assert all(n.startswith("model.language_model.") for n in names - ignored - {"lm_head.weight"})
    else:
        assert not ignored
    cfg = model.config
    assert cfg.layer_types == ["linear_attention", "linear_attention", "full_attention"] * 2
    assert (cfg.hidden_size, cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.head_dim) == (64, 2, 4, 32)
    if preset == "qwen35-tiny":
        assert cfg.tie_word_embeddings and "lm_head.weight" not in names
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    else:
        assert not cfg.tie_word_embeddings and "lm_head.weight" in names
        assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (8, 2, 32)
    logits = oracle.hf_logits(d, _text_ids(d, 300))
    assert logits.shape == (300, 512) and logits.dtype == np.float32
    assert np.isfinite(logits).all()
    assert 0.3 <= float(logits.std()) <= 3
    assert len(np.unique(logits.argmax(-1))) > 8


def test_the_conditional_class_loads_the_cond_layout_whole(dirs):
    # The cond directory is a complete Qwen3_5MoeForConditionalGeneration checkpoint (toy vision tower
    # included), and its text part computes what the causal class computes.
    d = dirs["qwen35moe-tiny-cond"]
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_5_moe" and cfg["text_config"]["model_type"] == "qwen3_5_moe_text"
    model, info = Qwen3_5MoeForConditionalGeneration.from_pretrained(
        d, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager",
        output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    ids = _text_ids(d, 64)
    with torch.no_grad():
        got = model.eval()(input_ids=torch.tensor([ids]), use_cache=False).logits[0].numpy()
    assert np.array_equal(got, oracle.hf_logits(d, ids))


def test_the_moe_layouts_hold_the_same_model(dirs):
    names = {p: _file_names(dirs[p]) for p in ("qwen35moe-tiny", "qwen35moe-tiny-fused")}
    assert "model.layers.0.mlp.experts.7.gate_proj.weight" in names["qwen35moe-tiny"]
    fused = names["qwen35moe-tiny-fused"]
    assert not any(".experts.0." in n for n in fused)
    header = _header(dirs["qwen35moe-tiny-fused"])
    assert header["model.layers.0.mlp.experts.gate_up_proj"].shape == (8, 64, 64)   # [E, 2I, D]
    assert header["model.layers.0.mlp.experts.down_proj"].shape == (8, 64, 32)      # [E, D, I]
    ids = _text_ids(dirs["qwen35moe-tiny"], 100)
    ref = oracle.hf_logits(dirs["qwen35moe-tiny"], ids)
    for preset in ("qwen35moe-tiny-cond", "qwen35moe-tiny-fused"):
        assert np.array_equal(oracle.hf_logits(dirs[preset], ids), ref), preset


def _count_calls(monkeypatch, module, name: str) -> list[int]:
    calls = [0]
    real = getattr(module, name)

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("preset", ["qwen35-tiny", "qwen35moe-tiny"])
def test_chunked_prefill_and_cached_decode_agree(dirs, preset, monkeypatch):
    d = dirs[preset]
    modeling = modeling_qwen3_5 if preset == "qwen35-tiny" else modeling_qwen3_5_moe
    chunked = _count_calls(monkeypatch, modeling, "torch_chunk_gated_delta_rule")
    recurrent = _count_calls(monkeypatch, modeling, "torch_recurrent_gated_delta_rule")
    model = oracle.load(d)
    n, prompt = 300, 150   # the prompt spans chunks 0-63, 64-127 and a partial 128-149
    ids = torch.tensor([_text_ids(d, n)])
    with torch.no_grad():
        full = model(input_ids=ids, use_cache=False).logits[0]
        cache = DynamicCache(config=model.config)
        rows = [model(input_ids=ids[:, :prompt], cache=cache, use_cache=True).logits[0]]
        rows += [model(input_ids=ids[:, t:t + 1], cache=cache, use_cache=True).logits[0] for t in range(prompt, n)]
    stepped = torch.cat(rows)
    n_linear = 4
    assert chunked[0] == 2 * n_linear and recurrent[0] == (n - prompt) * n_linear
    # fp32 rounding, amplified where the gated output norm rescales a small o (measured 2.7e-5 dense,
    # 2.5e-5 MoE): the delta rule itself agrees far closer (next test).
    gap = float((full - stepped).abs().max())
    lp_gap = float((torch.log_softmax(full, -1) - torch.log_softmax(stepped, -1)).abs().max())
    assert gap <= 5e-5 and lp_gap <= 5e-5, (gap, lp_gap)


@pytest.mark.parametrize("preset", ["qwen35-tiny", "qwen35moe-tiny"])
def test_the_decays_are_well_conditioned(dirs, preset, monkeypatch):
    # Every GDN layer's delta-rule inputs (q, k, v, g, beta) of a 300-token forward, run through HF's
    # chunked form and its per-token recurrence: the outputs agree to ~4e-7 of their scale (HF's own
    # initialisation, A up to 16 and dt_bias 1, measured 1.9e-6).
    modeling = modeling_qwen3_5 if preset == "qwen35-tiny" else modeling_qwen3_5_moe
    chunk, recur = modeling.torch_chunk_gated_delta_rule, modeling.torch_recurrent_gated_delta_rule
    seen = []

    def capture(q, k, v, g, beta, **kw):
        seen.append((q, k, v, g, beta))
        return chunk(q, k, v, g=g, beta=beta, **kw)

    monkeypatch.setattr(modeling, "torch_chunk_gated_delta_rule", capture)
    model = oracle.load(dirs[preset])
    with torch.no_grad():
        model(input_ids=torch.tensor([_text_ids(dirs[preset], 300)]), use_cache=False)
        assert len(seen) == 4
        for q, k, v, g, beta in seen:
            a, _ = chunk(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
            b, _ = recur(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
            assert float(g.min()) > -5 and float(g.max()) < 0    # per-token decays exp(g) in (0.007, 1)
            assert float((a - b).abs().max()) <= 1e-6 * float(b.abs().max())


def test_oracle_runs_hf_torch_reference_paths(dirs):
    import inspect

    oracle.require_torch_fallback()
    for modeling in (modeling_qwen3_5, modeling_qwen3_5_moe):
        for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
                     "causal_conv1d_update"):
            fn = getattr(modeling, name)
            # HF's hub/fla/causal-conv1d dispatch wraps each function; the implementation it chose at
            # import is the torch function itself.
            assert inspect.getclosurevars(fn).nonlocals["implementation"] is fn.__wrapped__, name
    model = oracle.load(dirs["qwen35moe-tiny"])
    assert model.config._attn_implementation == "eager"
    assert model.config._experts_implementation == "eager"


def test_oracle_greedy_follows_its_logits(dirs):
    d = dirs["qwen35moe-tiny"]
    ids = _text_ids(d, 40)
    out = oracle.hf_greedy(d, ids, 12)
    assert len(out) == 12
    logits = oracle.hf_logits(d, ids + out[:-1])
    assert logits.argmax(-1)[len(ids) - 1:].tolist() == out


def test_tokenizer_round_trips_and_keeps_qwen_tokens_whole(dirs):
    d = dirs["qwen35moe-tiny"]
    tok = AutoTokenizer.from_pretrained(d)
    assert len(tok) == 512 and tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    cfg = json.loads((d / "config.json").read_text())
    gen = json.loads((d / "generation_config.json").read_text())
    assert cfg["eos_token_id"] == tok.eos_token_id == gen["eos_token_id"][0]
    for t in qwen35.SPECIAL_TOKENS + qwen35.MARKUP_TOKENS:
        ids = tok.encode(t, add_special_tokens=False)
        assert ids == [tok.convert_tokens_to_ids(t)], t
    text = "héllo ✓ 日本 the model<|im_start|>user\nread a file<|im_end|>\n<think>\nok\n</think>\n\n"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    # As in the release, the markup tokens are text (kept by skip_special_tokens), the control tokens not.
    assert tok.decode(ids, skip_special_tokens=True) == text.replace("<|im_start|>", "").replace("<|im_end|>", "")


def test_hf_renders_a_tool_call_conversation_with_the_release_template(dirs):
    d = dirs["qwen35moe-tiny"]
    tok = AutoTokenizer.from_pretrained(d)
    assert tok.chat_template == qwen35.TEMPLATE.read_text()
    tools = [{"type": "function", "function": {
        "name": "read", "description": "read a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "n": {"type": "integer"}}}}}]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "read a.txt"},
        {"role": "assistant", "content": "", "reasoning_content": "need the file", "tool_calls": [
            {"type": "function", "function": {"name": "read", "arguments": {"path": "a.txt", "n": 10}}}]},
        {"role": "tool", "content": "contents"},
    ]
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n")
    assert text.endswith("\n\nBe brief.<|im_end|>\n<|im_start|>user\nread a.txt<|im_end|>\n"
                         "<|im_start|>assistant\n<think>\nneed the file\n</think>\n\n"
                         "<tool_call>\n<function=read>\n<parameter=path>\na.txt\n</parameter>\n"
                         "<parameter=n>\n10\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
                         "<|im_start|>user\n<tool_response>\ncontents\n</tool_response><|im_end|>\n"
                         "<|im_start|>assistant\n<think>\n")
    ids = tok.encode(text, add_special_tokens=False)
    for t in ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>", "<think>"):
        assert tok.convert_tokens_to_ids(t) in ids, t
    off = tok.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_bf16_directories_load_and_files_are_deterministic(tmp_path, dirs):
    d = make_model("qwen35-tiny", SEED, tmp_path / "bf16", dtype="bfloat16", shard_bytes=100_000)
    assert len(list(d.glob("model-*.safetensors"))) > 1
    model, info = oracle.load(d, with_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert json.loads((d / "config.json").read_text())["dtype"] == "bfloat16"
    again = make_model("qwen35moe-tiny-cond", SEED, tmp_path / "again")
    for f in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (again / f).read_bytes() == (dirs["qwen35moe-tiny-cond"] / f).read_bytes(), f
    other = make_model("qwen35moe-tiny-cond", SEED + 1, tmp_path / "other")
    assert (other / "model.safetensors").read_bytes() != (again / "model.safetensors").read_bytes()
