"""Quantized checkpoints in the official DeepSeek-V4 format (FP8 e4m3 128x128 blocks, FP4 or FP8
routed experts, ue8m0 scales), as `cairn make-model` writes them:

- HF transformers loads them on CPU (its FineGrainedFP8 dequantize path) and its dequantized
  weights equal ours exactly; cairn's logits match HF's at the fp32 parity tolerance;
- the kernel's quantized panels (stored bytes widened in registers) give the same bits as the fp32
  panels of the dequantized weights, for any chunking, call split, decode, snapshot and restore.
"""

from __future__ import annotations

import numpy as np
import pytest

# The HF oracle is part of `make test`'s install (extra `oracle`): a missing one is an error, never a skip.
import accelerate  # noqa: E402,F401  (transformers needs it to load the FP8 checkpoints)
import torch  # noqa: E402
from transformers import DeepseekV4ForCausalLM  # noqa: E402

import cairn._kernel as K  # noqa: E402
from cairn.daemon.modelgen.make_model import make_model, preset_with  # noqa: E402
from cairn.daemon.weights.model_dir import load_model, map_weights, open_model_dir  # noqa: E402
from cairn.daemon.modelgen.quantize import dequantize_fp4, dequantize_fp8  # noqa: E402
from cairn.daemon.weights.safetensors_io import read_header  # noqa: E402

from hf_oracle import canonical_weights  # noqa: E402

TOL = 1e-4
PROMPT, DECODE = 200, 12

# (preset, spelling): FP4 experts in the official spelling, FP8 experts in HF's (weight_scale_inv)
CASES = [("tiny-fp4", True), ("tiny-fp8", False)]


def dequantized(weights: dict) -> dict:
    """The fp32 weights the quantized ones stand for (numpy reference), scales dropped."""
    out = {}
    for name, (arr, tag) in weights.items():
        if tag == "F8_E8M0":
            continue
        if tag in ("F8_E4M3", "I8"):
            scale = weights[name.removesuffix("weight") + "scale"][0]
            arr, tag = (dequantize_fp8 if tag == "F8_E4M3" else dequantize_fp4)(arr, scale), "F32"
        out[name] = (arr, tag)
    return out


class Case:
    def __init__(self, preset: str, official: bool, root):
        self.dir = make_model(preset, 21, root / preset, official_names=official)
        self.md = open_model_dir(self.dir)
        self.weights = map_weights(self.md)
        rng = np.random.default_rng(7)
        self.prompt = rng.integers(0, self.md.config["vocab_size"], PROMPT).astype(np.int32)
        self._hf = None

    def model(self, threads: int = 2) -> K.Model:
        return load_model(self.md, threads)

    def fp32_model(self, threads: int = 2) -> K.Model:
        return K.Model(self.md.config, dequantized(self.weights), self.md.fingerprint, threads)

    @property
    def hf(self):
        if self._hf is None:
            self._hf = DeepseekV4ForCausalLM.from_pretrained(self.dir, dtype=torch.float32).eval()
        return self._hf

    def hf_logits(self, tokens: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return self.hf(input_ids=torch.tensor(tokens[None].astype(np.int64)), use_cache=False).logits[0].numpy()


@pytest.fixture(scope="module", params=CASES, ids=[f"{p}-{'official' if o else 'hf'}" for p, o in CASES])
def case(request, tmp_path_factory):
    return Case(*request.param, tmp_path_factory.mktemp("quant"))


def test_stored_format_is_the_official_one(case):
    tags = {name: tag for name, (_, tag) in case.weights.items()}
    expert = "I8" if case.md.config["quantization"]["expert_dtype"] == "fp4" else "F8_E4M3"
    assert tags["layers.1.ffn.experts.0.w1.weight"] == expert
    assert tags["layers.1.ffn.experts.0.w1.scale"] == "F8_E8M0"
    assert tags["layers.0.attn.wq_b.weight"] == "F8_E4M3"
    assert case.weights["layers.0.attn.wq_b.scale"][0].shape == (2, 1)  # [ceil(256/128), ceil(128/128)]
    assert tags["layers.0.ffn.gate.weight"] == tags["embed.weight"] == "F32"  # not quantized
    names = [n for f in case.dir.glob("*.safetensors") for n in read_header(f)[1]]
    assert any(n.endswith(".weight_scale_inv") for n in names) != any(n.endswith(".scale") for n in names)


def test_hf_dequantizes_to_exactly_our_reference(case):
    ours = dequantized(case.weights)
    theirs = canonical_weights(case.hf)
    assert theirs.keys() == ours.keys()
    for name, (arr, _) in theirs.items():
        np.testing.assert_array_equal(arr, np.asarray(ours[name][0]).astype(arr.dtype), err_msg=name)


def test_prefill_all_positions_match_hf(case):
    ref = case.hf_logits(case.prompt)
    n, logits = K.prefill(K.State(case.model()), case.prompt, chunk=37, all_logits=True)
    assert n == PROMPT
    diff = np.abs(logits - ref).max(axis=1)
    assert diff.max() <= TOL, f"max |dlogit| {diff.max():.3g} first at position {int(np.argmax(diff > TOL))}"
    assert 0.3 <= float(ref.std()) <= 3  # plausible values: logits neither flat nor exploding


def test_greedy_decode_matches_hf(case):
    st = K.State(case.model())
    _, logits = K.prefill(st, case.prompt, chunk=64)
    toks = list(case.prompt)
    for _ in range(DECODE):
        toks.append(int(logits.argmax()))
        logits = K.decode(st, toks[-1])
    ref = case.hf_logits(np.array(toks, dtype=np.int32))
    assert np.abs(logits - ref[-1]).max() <= TOL
    assert [int(t) for t in ref[PROMPT - 1:-1].argmax(1)] == toks[PROMPT:]


def test_quantized_panels_give_the_bits_of_fp32_on_dequantized_weights(case):
    toks = case.prompt
    ref = K.prefill(K.State(case.fp32_model()), toks, chunk=512, all_logits=True)[1]
    m = case.model()
    for chunk in (1, 7, 37, 128, 512):
        np.testing.assert_array_equal(K.prefill(K.State(m), toks, chunk=chunk, all_logits=True)[1], ref)
    st, rows = K.State(m), []
    for a, b in [(0, 37), (37, 38), (38, 131), (131, 180)]:
        rows.append(K.prefill(st, toks[a:b], chunk=64, all_logits=True)[1])
    rows += [K.decode(st, int(t))[None] for t in toks[180:]]
    np.testing.assert_array_equal(np.concatenate(rows), ref)


def test_decode_takes_the_scaled_chain_with_the_fp32_bits(case):
    """Decode's products over FP8 / FP4 panels run on the accumulator-scaled chain
    (native/src/formats/pow2_chain.h; tests/native/test_pow2_chain.py) and still give the fp32 bits."""
    toks = case.prompt[:40]
    ref = K.prefill(K.State(case.fp32_model()), toks, chunk=512, all_logits=True)[1]
    st = K.State(case.model())
    K.prefill(st, toks[:30], chunk=30)
    K._pow2_chain(True, reset=True)
    rows = [K.decode(st, int(t))[None] for t in toks[30:]]
    assert K._pow2_chain()["scaled"] > 0
    np.testing.assert_array_equal(np.concatenate(rows), ref[30:])


def test_quantized_snapshot_restore_continues_with_fp32_bits(case):
    m, f = case.model(), case.fp32_model()
    st = K.State(m)
    K.prefill(st, case.prompt[:131], chunk=37)
    fresh = K.State.restore(m, st.snapshot())
    got = K.prefill(fresh, case.prompt[131:], chunk=37, all_logits=True)[1]
    ref_state = K.State(f)
    K.prefill(ref_state, case.prompt[:131], chunk=37)
    want = K.prefill(ref_state, case.prompt[131:], chunk=37, all_logits=True)[1]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(K.decode(fresh, 3), K.decode(ref_state, 3))


@pytest.mark.parametrize("quant", ["fp8", "fp4"])
def test_partial_scale_blocks_give_the_bits_of_fp32(tmp_path, quant):
    """Dimensions that are not multiples of 128 (partial FP8 blocks at the edges, panels whose 16
    rows straddle a block boundary in wo_a's groups): still the fp32 bits. HF cannot load these
    (it derives block sizes by division), so the kernel is checked against itself only."""
    p = preset_with("tiny-fp4", quant=quant, hidden_size=192, q_lora_rank=160, o_lora_rank=72,
                    moe_intermediate_size=96)
    md = open_model_dir(make_model(p, 3, tmp_path))
    w = map_weights(md)
    assert w["layers.0.attn.wq_a.scale"][0].shape == (2, 2)
    toks = np.random.default_rng(1).integers(0, 512, 90).astype(np.int32)
    q = K.prefill(K.State(load_model(md, 2)), toks, chunk=37, all_logits=True)[1]
    f = K.prefill(K.State(K.Model(md.config, dequantized(w), md.fingerprint, 2)), toks, chunk=37, all_logits=True)[1]
    np.testing.assert_array_equal(q, f)
    assert np.isfinite(q).all()


def test_out_of_range_scale_byte_is_refused(case):
    weights = dict(case.weights)
    scale = np.array(weights["layers.0.attn.wq_a.scale"][0])
    scale[0, 0] = 255  # NaN in ue8m0
    weights["layers.0.attn.wq_a.scale"] = (scale, "F8_E8M0")
    with pytest.raises(ValueError, match=r"'layers\.0\.attn\.wq_a\.scale' holds scale byte 255"):
        K.Model(case.md.config, weights, "x", 1)


def test_loading_releases_the_mapped_sources(case):
    """Packed matrices are copies; their mapped sources are dropped after packing, so the
    mapping's pages do not stay in the process (only in-place tensors are kept: F32 at an aligned offset)."""
    import gc
    import weakref

    weights = map_weights(case.md)
    probe = weakref.ref(weights["layers.1.ffn.experts.0.w2.weight"][0])
    norm = weights["layers.0.attn_norm.weight"][0]
    in_place = norm.ctypes.data % norm.itemsize == 0   # a misaligned view is copied (aligned loads only)
    kept = weakref.ref(norm)
    m = K.Model(case.md.config, weights, "x", 1)
    del weights, norm
    gc.collect()
    assert probe() is None and (kept() is not None) == in_place
    del m
