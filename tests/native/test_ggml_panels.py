"""GGUF block formats computed on as stored (native/src/formats/ggml_blocks.cpp over the block codecs
in native/src/codecs/): a model whose matrices, embedding and other tensors hold GGUF blocks gives
the bits of cairn's fp32 path on the weights gguf.quants.dequantize makes of them — all-position
logits for any chunking, decode, batched decode, and after a snapshot restore."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

import cairn._kernel as K
from cairn.daemon.modelgen.make_model import make_model, preset_with
from cairn.daemon.weights.model_dir import map_weights, open_model_dir
from test_codecs import set_iq1m_d

QUANT = ["Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K", "IQ2_XXS", "MXFP4", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
         "IQ4_NL", "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M"]
PROMPT = 150


def random_blocks(qtype: str, n: int, rng) -> np.ndarray:
    """n random blocks of a type: random bytes, with every scale field a sane finite value (the
    weights come out ~1e-2, as trained ones; the bits are whatever the format's reference makes)."""
    block, nbytes = GGML_QUANT_SIZES[T[qtype]]
    b = rng.integers(0, 256, (n, nbytes), dtype=np.uint8)

    def f16(col, lo=-2e-3, hi=2e-3):
        b[:, col:col + 2] = rng.uniform(lo, hi, n).astype(np.float16).view(np.uint8).reshape(n, 2)

    if qtype in ("Q8_0", "IQ2_XXS", "Q4_K", "Q5_K"):
        f16(0, 1e-4, 2e-3 if qtype != "Q8_0" else 5e-4)
        if qtype in ("Q4_K", "Q5_K"):
            f16(2, 0, 1e-4)
    elif qtype == "Q6_K":
        f16(nbytes - 2, 1e-5, 1e-4)
    elif qtype == "Q2_K":
        f16(nbytes - 4, 1e-4, 1e-3)
        f16(nbytes - 2, 0, 1e-4)
    elif qtype == "Q3_K":
        f16(nbytes - 2, 1e-5, 2e-4)
    elif qtype == "MXFP4":
        b[:, 0] = rng.integers(118, 122, n)     # e8m0: 2^-9 .. 2^-5 (x 0.5: the format's half unit)
    elif qtype in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
        f16(0, 1e-4, 1e-3)
        if qtype.endswith("_1"):
            f16(2, -1e-2, 0)                    # the min: the lowest weight of the block
    elif qtype == "IQ4_NL":
        f16(0, 1e-5, 1e-4)
    elif qtype == "IQ4_XS":
        f16(0, 1e-6, 5e-6)                      # times a sub-block scale of -32 .. 31
    elif qtype in ("IQ3_XXS", "IQ3_S"):
        f16(0, 1e-5, 5e-5)                      # times scale factors up to 8 / 31 and magnitudes up to 62 / 15
    elif qtype in ("IQ2_XS", "IQ2_S"):
        f16(0, 1e-4, 5e-4)
    elif qtype == "IQ1_S":
        f16(0, 1e-4, 1e-3)
    elif qtype == "IQ1_M":
        set_iq1m_d(b, rng.uniform(1e-4, 1e-3, n).astype(np.float16).view(np.uint16))
    return b


class GgmlCase:
    """A tiny model whose tensors are GGUF blocks where the type's block divides the row."""

    def __init__(self, root):
        p = preset_with("tiny", hidden_size=256, q_lora_rank=256, moe_intermediate_size=256, o_lora_rank=32)
        self.dir = make_model(p, 5, root / "ggml")
        self.md = open_model_dir(self.dir)
        w = map_weights(self.md)
        rng = np.random.default_rng(11)
        self.quant, self.ref, self.types = {}, {}, {}
        i = 0
        for name, (arr, tag) in sorted(w.items()):
            if tag != "F32" or arr.ndim != 2 or name.endswith("ape"):
                self.quant[name] = self.ref[name] = (arr, tag)
                continue
            rows, cols = arr.shape
            fits = [q for q in QUANT if cols % GGML_QUANT_SIZES[T[q]][0] == 0]
            if not fits:
                self.quant[name] = self.ref[name] = (arr, tag)
                continue
            if ".w3." in name and name.replace(".w3.", ".w1.") in self.types:
                q = self.types[name.replace(".w3.", ".w1.")]   # gate and up share a format (one fused matrix)
            else:
                q = fits[i % len(fits)]
                i += 1
            block, nbytes = GGML_QUANT_SIZES[T[q]]
            blocks = random_blocks(q, rows * cols // block, rng)
            self.quant[name] = (blocks.reshape(rows, cols // block * nbytes), f"GGML:{q}")
            self.ref[name] = (dequantize(blocks.reshape(-1), T[q]).reshape(rows, cols).astype(np.float32), "F32")
            self.types[name] = q
        self.prompt = rng.integers(0, self.md.config["vocab_size"], PROMPT).astype(np.int32)

    def model(self, weights, threads=2):
        return K.Model(self.md.config, weights, self.md.fingerprint, threads)


@pytest.fixture(scope="module")
def ggml(tmp_path_factory):
    return GgmlCase(tmp_path_factory.mktemp("ggml"))


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def test_every_type_is_used_for_matrices_and_the_embedding(ggml):
    used = set(ggml.types.values())
    assert used == set(QUANT), f"types not covered: {set(QUANT) - used}"
    assert "embed.weight" in ggml.types and "head.weight" in ggml.types


def test_blocks_give_the_bits_of_fp32_on_dequantized_weights_for_any_chunking(ggml):
    mq, mf = ggml.model(ggml.quant), ggml.model(ggml.ref)
    ref = K.prefill(K.State(mf), ggml.prompt, chunk=PROMPT, all_logits=True)[1]
    assert np.isfinite(ref).all() and np.abs(ref).max() > 0
    for chunk in (PROMPT, 37, 1):
        got = K.prefill(K.State(mq), ggml.prompt, chunk=chunk, all_logits=True)[1]
        assert np.array_equal(bits(got), bits(ref)), f"chunk {chunk}"


def test_decode_batched_decode_and_restore_give_the_fp32_bits(ggml):
    mq, mf = ggml.model(ggml.quant), ggml.model(ggml.ref)
    sq, sf = K.State(mq), K.State(mf)
    K.prefill(sq, ggml.prompt[:100], chunk=64)
    K.prefill(sf, ggml.prompt[:100], chunk=64)
    snap = sq.snapshot()
    want = [K.decode(sf, int(t)) for t in ggml.prompt[100:110]]
    got = [K.decode(sq, int(t)) for t in ggml.prompt[100:110]]
    assert all(np.array_equal(bits(a), bits(b)) for a, b in zip(got, want))
    restored = K.State.restore(mq, snap)
    again = [K.decode(restored, int(t)) for t in ggml.prompt[100:110]]
    assert all(np.array_equal(bits(a), bits(b)) for a, b in zip(again, want))
    # two sequences in one batched call give each one's decode bits
    a, b = K.State(mq), K.State(mq)
    K.prefill(a, ggml.prompt[:40], chunk=40)
    K.prefill(b, ggml.prompt[:70], chunk=70)
    la, lb = K.decode_batch([a, b], [int(ggml.prompt[40]), int(ggml.prompt[70])])
    a1, b1 = K.State(mf), K.State(mf)
    K.prefill(a1, ggml.prompt[:40], chunk=40)
    K.prefill(b1, ggml.prompt[:70], chunk=70)
    assert np.array_equal(bits(la), bits(K.decode(a1, int(ggml.prompt[40]))))
    assert np.array_equal(bits(lb), bits(K.decode(b1, int(ggml.prompt[70]))))


@pytest.mark.parametrize("qtype", QUANT)
def test_a_wide_matrix_gives_the_fp32_bits_in_decode_and_prefill(qtype):
    """The model's matrices are narrower than one 512-column span; here K is three spans and a half
    (the in-register widening's span and prefetch arithmetic) and N ends in a partial panel, for the
    decode row counts (in registers) and prefill's (the tile)."""
    rng = np.random.default_rng(int(T[qtype]))
    block, nbytes = GGML_QUANT_SIZES[T[qtype]]
    n, k = 40, 3 * 512 + 256
    blocks = random_blocks(qtype, n * k // block, rng)
    w = dequantize(blocks.reshape(-1), T[qtype]).reshape(n, k).astype(np.float32)
    for m in (1, 2, 6, 9):
        x = rng.standard_normal((m, k)).astype(np.float32)
        want, _ = K._packed_matmul(x, w, 2)
        got, _ = K._ggml_matmul(x, blocks.reshape(n, k // block * nbytes), qtype, 2)
        assert np.abs(want).max() > 0
        assert np.array_equal(bits(got), bits(want)), f"{qtype}, {m} rows"


def test_resident_panels_hold_the_stored_bytes(ggml):
    stored = sum(a.nbytes for n, (a, _) in ggml.quant.items() if n in ggml.types and n != "embed.weight")
    m = ggml.model(ggml.quant)
    fp32 = ggml.model(ggml.ref)
    saved = sum(ggml.ref[n][0].nbytes for n in ggml.types if n != "embed.weight") - stored
    # the packed arena shrinks by what the blocks save against fp32 panels (padding aside)
    assert fp32.packed_bytes - m.packed_bytes >= 0.9 * saved


def test_an_unsupported_type_names_the_tensor_and_the_supported_types(ggml):
    w = dict(ggml.quant)
    name = "layers.0.attn.wq_a.weight"
    w[name] = (np.zeros((256, 256 // 256 * 66), np.uint8), "GGML:TQ2_0")
    with pytest.raises(ValueError) as e:
        ggml.model(w)
    msg = str(e.value)
    assert name in msg and "TQ2_0" in msg and all(q in msg for q in ("Q8_0", "Q4_0", "IQ4_XS", "IQ1_M"))


def test_gate_and_up_in_different_formats_are_refused_by_name(ggml):
    w = dict(ggml.quant)
    gate, up = "layers.1.ffn.experts.0.w1.weight", "layers.1.ffn.experts.0.w3.weight"
    other = "Q8_0" if ggml.types[gate] != "Q8_0" else "Q4_K"
    block, nbytes = GGML_QUANT_SIZES[T[other]]
    rows, cols = ggml.ref[up][0].shape
    w[up] = (np.zeros((rows, cols // block * nbytes), np.uint8), f"GGML:{other}")
    with pytest.raises(ValueError) as e:
        ggml.model(w)
    assert gate in str(e.value) and up in str(e.value) and other in str(e.value)


def test_a_row_that_is_not_whole_blocks_is_refused(ggml):
    w = dict(ggml.quant)
    name = "layers.0.attn.wq_a.weight"
    w[name] = (np.zeros((256, 7), np.uint8), "GGML:Q8_0")
    with pytest.raises(ValueError, match="wq_a"):
        ggml.model(w)


def test_routed_experts_of_blocks_page_from_disk_with_the_resident_bits(ggml, tmp_path):
    """--expert-cache on GGUF blocks: the experts' panels (the stored blocks) are read from the packed
    file into a slot pool on demand, as for the official FP4 experts; outputs keep every bit."""
    packed = str(tmp_path / "packed.bin")
    resident = ggml.model(ggml.quant)
    K.Model(ggml.md.config, ggml.quant, ggml.md.fingerprint, 2, packed_cache=packed)   # writes the file
    info = resident.expert_cache_info()
    k = ggml.md.config["num_experts_per_tok"]
    paged = K.Model(ggml.md.config, ggml.quant, ggml.md.fingerprint, 2, packed_cache=packed,
                    expert_cache_bytes=k * info["slot_bytes"])
    assert paged.expert_cache_info()["paging"]
    out = []
    for m in (resident, paged):
        st = K.State(m)
        out.append((K.prefill(st, ggml.prompt, chunk=29, all_logits=True)[1], [K.decode(st, int(t)) for t in (3, 141)]))
    assert np.array_equal(bits(out[1][0]), bits(out[0][0]))
    assert all(np.array_equal(a, b) for a, b in zip(out[1][1], out[0][1]))
    # a slot holds the largest expert's stored blocks (fused gate/up, then down), rounded to pages
    cfg = ggml.md.config
    largest = max(sum(ggml.quant[f"layers.{l}.ffn.experts.{e}.w{i}.weight"][0].nbytes for i in (1, 2, 3))
                  for l in range(cfg["num_hidden_layers"]) for e in range(cfg["n_routed_experts"]))
    assert largest <= info["slot_bytes"] < largest + 3 * 4096
