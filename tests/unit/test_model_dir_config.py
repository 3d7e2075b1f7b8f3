"""resolve_config: HF field names, legacy names and defaults -> the flat dict the kernel reads."""

from __future__ import annotations

import pytest

from cairn.daemon.modelgen.make_model import PRESETS, hf_config
from cairn.daemon.weights.dsv4.config import CSA, HCA, SLIDING, resolve_config
from cairn.daemon.weights.model_dir import ModelDirError

MINIMAL = {"model_type": "deepseek_v4", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 4,
           "num_attention_heads": 4}


def test_generated_config_resolves_to_the_preset():
    p = PRESETS["tiny"]
    cfg = resolve_config(hf_config(p))
    assert cfg["qk_rope_head_dim"] == p.qk_rope_head_dim == 8
    assert (cfg["csa_rate"], cfg["hca_rate"]) == (4, 16)
    assert cfg["layer_types"] == list(p.layer_types)
    assert (cfg["rope_theta"], cfg["compress_rope_theta"], cfg["compress_rope_type"], cfg["yarn_factor"]) == \
        (10000.0, 160000.0, "yarn", 16.0)


def test_defaults_follow_hf():
    cfg = resolve_config(MINIMAL)
    assert cfg["head_dim"] == 512 and cfg["qk_rope_head_dim"] == 64
    assert cfg["layer_types"] == [HCA, HCA, HCA, CSA]
    assert cfg["mlp_layer_types"] == ["hash_moe"] * 3 + ["moe"]
    assert (cfg["csa_rate"], cfg["hca_rate"], cfg["sliding_window"]) == (4, 128, 128)
    assert cfg["compress_rope_type"] == "default" and cfg["compress_rope_theta"] == 160000.0


def test_legacy_names():
    cfg = resolve_config(MINIMAL | {"compress_ratios": [0, 4, 128, 4], "num_hash_layers": 1,
                                    "qk_rope_head_dim": 32, "head_dim": 128})
    assert cfg["layer_types"] == [SLIDING, CSA, HCA, CSA]
    assert cfg["mlp_layer_types"] == ["hash_moe", "moe", "moe", "moe"]
    assert cfg["qk_rope_head_dim"] == 32


def test_partial_rotary_factor_wins_over_qk_rope_head_dim():
    cfg = resolve_config(MINIMAL | {"head_dim": 128, "partial_rotary_factor": 0.5, "qk_rope_head_dim": 32})
    assert cfg["qk_rope_head_dim"] == 64


def test_flat_rope_scaling_takes_thetas_from_the_top_level():
    # a theta inside a flat (legacy) dict is the main one; the compress rope uses compress_rope_theta
    cfg = resolve_config(MINIMAL | {"rope_theta": 20000.0, "compress_rope_theta": 80000.0,
                                    "rope_scaling": {"type": "yarn", "factor": 8.0, "rope_theta": 20000.0,
                                                     "original_max_position_embeddings": 4096}})
    assert (cfg["rope_theta"], cfg["compress_rope_theta"]) == (20000.0, 80000.0)
    assert (cfg["compress_rope_type"], cfg["yarn_factor"], cfg["yarn_original_max_position_embeddings"]) == \
        ("yarn", 8.0, 4096)


def test_nested_rope_parameters_take_their_own_thetas():
    cfg = resolve_config(MINIMAL | {"rope_theta": 1.0, "rope_parameters": {
        "main": {"rope_type": "default", "rope_theta": 30000.0},
        "compress": {"rope_type": "default", "rope_theta": 90000.0}}})
    assert (cfg["rope_theta"], cfg["compress_rope_theta"]) == (30000.0, 90000.0)


@pytest.mark.parametrize("change, error", [
    ({"model_type": "deepseek_v3"}, "model_type is 'deepseek_v3'"),
    ({"vocab_size": None}, "field 'vocab_size' must be int"),
    ({"hidden_size": "64"}, "field 'hidden_size' must be int"),
    ({"layer_types": [SLIDING, "full_attention", CSA, HCA]}, "layer_types must list 4 entries"),
    ({"compress_ratios": [0, 4, 64, 4]}, "compress_ratios entries must be 0, 4 or 128"),
    ({"scoring_func": "softmax"}, "scoring_func 'softmax' is not supported"),
    ({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                              "activation_scheme": "dynamic", "weight_block_size": [64, 64]}},
     "quantization_config.weight_block_size is [64, 64]; only [128, 128]"),
    ({"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
                              "weight_block_size": [128, 128]}},
     "quantization_config.scale_fmt is None; cairn supports the official DeepSeek-V4 quantization only"),
    ({"quantization_config": {"quant_method": "awq"}}, "quantization_config.quant_method is 'awq'"),
    ({"expert_dtype": "int4", "quantization_config": {
        "quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "activation_scheme": "dynamic",
        "weight_block_size": [128, 128]}}, "expert_dtype is 'int4'; allowed: 'fp8', 'fp4'"),
    ({"rope_parameters": {"rope_type": "longrope"}}, "compress rope_type 'longrope' is not supported"),
    ({"rope_parameters": {"main": {"rope_type": "yarn"}, "compress": {}}}, "main rope_type 'yarn' is not supported"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 16.0, "attention_factor": 1.277}},
     "attention_factor 1.277 is not supported"),
    ({"rope_theta": "big"}, "rope_theta must be a positive number"),
    ({"tie_word_embeddings": True}, "tie_word_embeddings is not supported"),
    ({"n_shared_experts": 2}, "n_shared_experts must be 1"),
    ({"o_groups": 3}, "divisible by o_groups"),
])
def test_unsupported_configs_are_refused(change, error):
    with pytest.raises(ModelDirError, match="config.json: ") as e:
        resolve_config(MINIMAL | {"head_dim": 128} | change)
    assert error in str(e.value)


def test_official_quantization_config_is_accepted_with_expert_dtype_at_either_level():
    q = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "weight_block_size": [128, 128],
         "activation_scheme": "dynamic"}
    assert resolve_config(MINIMAL | {"expert_dtype": "fp4", "quantization_config": q})["quantization"] == \
        {"expert_dtype": "fp4"}
    assert resolve_config(MINIMAL | {"quantization_config": q | {"expert_dtype": "fp4"}})["quantization"] == \
        {"expert_dtype": "fp4"}
    assert resolve_config(MINIMAL | {"quantization_config": q})["quantization"] == {"expert_dtype": "fp8"}
    assert "quantization" not in resolve_config(MINIMAL)  # unquantized fingerprints do not change
