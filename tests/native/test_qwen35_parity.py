"""Kernel vs HF Qwen3.5 (fp32, issue 43 step 4; the oracle: hf_oracle_qwen35.py): all-position logits
of `_kernel.Qwen35Model` against HF's no-cache forward on the `make-model` presets (dense `qwen35-tiny`,
MoE `qwen35moe-tiny`), with every layer full attention, every layer Gated DeltaNet, and the presets'
hybrid; greedy tokens (the kernel re-running the prefix); the per-token state carried across chunks
gives the same bits as one call; bad weights and configs are named."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file

import cairn._kernel as K
from cairn.daemon.modelgen.make_model import make_model
from cairn.daemon.modelgen.qwen35 import FULL, LIN, PRESETS

from hf_oracle_qwen35 import hf_greedy, hf_logits

TOL = 1e-4
SEED = 5
PROMPT_LEN = 96
N_GREEDY = 16
VARIANTS = {"full": (FULL,) * 4, "linear": (LIN,) * 4, "hybrid": None}  # None: the preset's own layer_types


def _kernel_weights(model_dir) -> dict[str, np.ndarray]:
    """The safetensors tensors under cairn's canonical names (HF's without `model.` /
    `model.language_model.`); the vision tower and the MTP head are not the text model's."""
    out: dict[str, np.ndarray] = {}
    for f in sorted(os.listdir(model_dir)):
        if not f.endswith(".safetensors"):
            continue
        for name, a in load_file(os.path.join(model_dir, f)).items():
            if name.startswith(("model.visual.", "mtp.")):
                continue
            out[name.removeprefix("model.language_model.").removeprefix("model.")] = a
    return out


@dataclasses.dataclass
class Case:
    config: dict
    weights: dict[str, np.ndarray]
    tokens: np.ndarray   # [PROMPT_LEN] int32
    ref: np.ndarray      # [PROMPT_LEN, V] HF logits, no cache
    greedy: np.ndarray   # [N_GREEDY] HF greedy tokens (cached decode) after the first half of tokens

    def model(self, **kw):
        return K.Qwen35Model(self.config, self.weights, **kw)


_CASES: dict[tuple[str, str], Case] = {}


def _case(preset: str, variant: str, tmp_path_factory) -> Case:
    key = (preset, variant)
    if key in _CASES:
        return _CASES[key]
    p = PRESETS[preset]
    if VARIANTS[variant] is not None:
        p = dataclasses.replace(p, layer_types=VARIANTS[variant])
    d = make_model(p, SEED, tmp_path_factory.mktemp(f"{preset}-{variant}"))
    config = json.loads((d / "config.json").read_text())
    rng = np.random.default_rng(SEED)
    tokens = rng.integers(0, config["vocab_size"], PROMPT_LEN).astype(np.int32)
    ref = hf_logits(d, tokens)
    # HF's cache cannot count tokens without an attention layer: greedy references for the hybrid only
    greedy = np.array(hf_greedy(d, tokens[:PROMPT_LEN // 2], N_GREEDY) if variant == "hybrid" else [], dtype=np.int32)
    _CASES[key] = Case(config, _kernel_weights(d), tokens, ref, greedy)
    return _CASES[key]


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("preset", ["qwen35-tiny", "qwen35moe-tiny"])
def test_all_position_logits_match_hf(preset, variant, tmp_path_factory):
    c = _case(preset, variant, tmp_path_factory)
    m = c.model()
    want = list(VARIANTS[variant] or PRESETS[preset].layer_types)
    assert m.layer_types == want and m.is_moe == (preset == "qwen35moe-tiny")
    logits = m.forward(c.tokens)
    assert logits.shape == c.ref.shape and logits.dtype == np.float32
    diff = np.abs(logits - c.ref).max(axis=1)
    assert diff.max() <= TOL, f"max |dlogit| {diff.max():.3g} first at position {int(np.argmax(diff > TOL))}"
    assert (logits.argmax(1) == c.ref.argmax(1)).all()


@pytest.mark.parametrize("preset", ["qwen35-tiny", "qwen35moe-tiny"])
def test_greedy_tokens_match_hf(preset, tmp_path_factory):
    c = _case(preset, "hybrid", tmp_path_factory)
    m = c.model()
    seq = list(c.tokens[:PROMPT_LEN // 2])
    got = []
    for _ in range(N_GREEDY):  # the whole prefix each step: no state is kept between calls yet
        t = int(m.forward(np.array(seq, dtype=np.int32))[-1].argmax())
        got.append(t)
        seq.append(t)
    np.testing.assert_array_equal(np.array(got, dtype=np.int32), c.greedy)


@pytest.mark.parametrize("preset", ["qwen35-tiny", "qwen35moe-tiny"])
def test_chunked_calls_and_threads_give_identical_bits(preset, tmp_path_factory):
    """Every write is per token (a conv row, a recurrence step, a K/V row), so the sequence split into
    calls of any size -- the state carried between them -- gives the bits of one call, on any thread count."""
    c = _case(preset, "hybrid", tmp_path_factory)
    m = c.model(threads=2)
    whole = m.forward(c.tokens)
    for chunk in (1, 3, 7, 64):
        np.testing.assert_array_equal(m.forward(c.tokens, chunk=chunk), whole, err_msg=f"chunk={chunk}")
    np.testing.assert_array_equal(c.model(threads=1).forward(c.tokens), whole)


def test_fused_and_conditional_layouts_give_the_same_bits(tmp_path):
    """The fused 3-D expert tensors and the conditional-generation layout (nested text_config,
    model.language_model.* names) load to the same model as the per-expert causal layout."""
    outs = []
    for preset in ("qwen35moe-tiny", "qwen35moe-tiny-fused", "qwen35moe-tiny-cond"):
        d = make_model(preset, SEED, tmp_path / preset)
        cfg = json.loads((d / "config.json").read_text())
        w = _kernel_weights(d)
        assert ("layers.0.mlp.experts.gate_up_proj" in w) == (preset == "qwen35moe-tiny-fused")
        outs.append(K.Qwen35Model(cfg, w).forward(np.arange(40, dtype=np.int32)))
    np.testing.assert_array_equal(outs[1], outs[0])
    np.testing.assert_array_equal(outs[2], outs[0])


def test_bad_weights_and_config_are_named(tmp_path_factory):
    c = _case("qwen35moe-tiny", "hybrid", tmp_path_factory)
    w = dict(c.weights)
    del w["layers.0.linear_attn.in_proj_z.weight"]
    with pytest.raises(ValueError, match=r"missing weight tensor 'layers\.0\.linear_attn\.in_proj_z\.weight' "
                                         r"\(expected shape \[64, 64\]\)"):
        K.Qwen35Model(c.config, w)
    w = dict(c.weights)
    w["layers.2.self_attn.k_proj.weight"] = np.zeros((32, 64), np.float32)
    with pytest.raises(ValueError, match=r"'layers\.2\.self_attn\.k_proj\.weight' has shape \[32, 64\], "
                                         r"expected \[64, 64\]"):
        K.Qwen35Model(c.config, w)
    w = dict(c.weights)
    w["norm.weight"] = w["norm.weight"].astype(np.float64)
    with pytest.raises(ValueError, match=r"'norm\.weight' has dtype float64; float32 is required"):
        K.Qwen35Model(c.config, w)
    with pytest.raises(ValueError, match=r"layer_types has 2 entries, num_hidden_layers is 6"):
        K.Qwen35Model({**c.config, "layer_types": [LIN, FULL]}, c.weights)
    with pytest.raises(ValueError, match=r"linear_num_value_heads \(3\) must be a multiple of linear_num_key_heads"):
        K.Qwen35Model({**c.config, "linear_num_value_heads": 3}, c.weights)
    with pytest.raises(ValueError, match=r"ids\[1\] = 512 is outside the vocabulary \[0, 512\)"):
        c.model().forward(np.array([1, 512], dtype=np.int32))


def test_layer_kinds_from_full_attention_interval(tmp_path_factory):
    """Without layer_types, every full_attention_interval-th layer is full attention (HF's default rule):
    interval 3 on the hybrid preset [lin, lin, full] x 2 is the same model."""
    c = _case("qwen35moe-tiny", "hybrid", tmp_path_factory)
    cfg = {k: v for k, v in c.config.items() if k != "layer_types"}
    m = K.Qwen35Model({**cfg, "full_attention_interval": 3}, c.weights)
    assert m.layer_types == list(PRESETS["qwen35moe-tiny"].layer_types)
    np.testing.assert_array_equal(m.forward(c.tokens[:20]), c.model().forward(c.tokens[:20]))
