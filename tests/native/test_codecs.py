"""GGUF block codecs (native/src/codecs/): every format's decoder is bit-identical to the reference,
gguf.quants.dequantize (llama.cpp's Python package), on random blocks and on blocks the package
quantizes itself; the single-block and the multi-block entry points agree; the table's block and
byte sizes are the package's; an unsupported type is refused by name."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

import cairn._kernel as K

ROOT = Path(__file__).resolve().parents[2]

# Byte offsets of each format's f16 scale fields (llama.cpp's block structs): random bytes there
# would be NaN or inf now and then, which real files never carry, so the random-block test puts
# finite f16 values there. MXFP4's e8m0 byte is finite for every value and stays random.
F16_FIELDS = {
    "Q8_0": [0], "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "IQ2_XXS": [0], "MXFP4": [], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "IQ4_NL": [0],
    "IQ4_XS": [0], "IQ3_XXS": [0], "IQ3_S": [0], "IQ2_XS": [0], "IQ2_S": [0], "IQ1_S": [0],
    "IQ1_M": [],   # its d is the top nibbles of the four scale u16 at 48 (random_blocks)
}
# GGUF's F32/F16/BF16 are no block codecs: the loader passes them as the float types they are.
TYPES = list(F16_FIELDS)
# The types gguf.quants.quantize implements, with the decimal exponent range of the test data's row
# magnitudes: as wide as the format's scale can hold (f16 scales overflow past ~6e4 * the code range).
QUANTIZABLE = {"Q8_0": (-9, 6), "MXFP4": (-38, 30),
               "Q4_0": (-9, 4), "Q4_1": (-9, 4), "Q5_0": (-9, 4), "Q5_1": (-9, 4)}


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def assert_bit_identical(name: str, blocks: np.ndarray) -> None:
    with np.errstate(over="ignore"):   # MXFP4's largest exponent times 12 is inf, in both
        ref = quants.dequantize(blocks.reshape(-1), T[name]).reshape(-1)
    got = K.codec_dequantize(int(T[name]), blocks)
    assert got.shape == ref.shape
    diff = np.flatnonzero(bits(got) != bits(ref))
    if diff.size:
        i = diff[0]
        block = GGML_QUANT_SIZES[T[name]][0]
        pytest.fail(f"{name}: {diff.size} of {ref.size} weights differ; first at {i} (block {i // block}): "
                    f"got {got[i]!r} ({bits(got)[i]:#010x}), reference {ref[i]!r} ({bits(ref)[i]:#010x})")


def finite_f16(rng: np.random.Generator, n: int) -> np.ndarray:
    """n finite f16 bit patterns, every exponent equally likely (subnormals, both zeros and negatives
    included), with the edge values always present."""
    h = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
    h = np.where((h & 0x7C00) == 0x7C00, h & ~np.uint16(0x4000), h).astype(np.uint16)  # exp 31 -> 15
    edges = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x3C00, 0xBC00],
                     dtype=np.uint16)
    h[: min(n, edges.size)] = edges[: min(n, edges.size)]
    return h


def random_blocks(name: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    block, size = GGML_QUANT_SIZES[T[name]]
    blocks = rng.integers(0, 256, (n, size), dtype=np.uint8)
    for off in F16_FIELDS.get(name, []):
        blocks[:, off:off + 2] = finite_f16(rng, n).view(np.uint8).reshape(n, 2)
    if name == "IQ1_M":
        set_iq1m_d(blocks, finite_f16(rng, n))
    return blocks


def set_iq1m_d(blocks: np.ndarray, d: np.ndarray) -> None:
    """IQ1_M keeps its f16 d in the top nibbles of the four scale u16 at byte 48 (nibble i: d's bits 4i..)."""
    sc = blocks[:, 48:56].copy().view("<u2")
    for i in range(4):
        sc[:, i] = (sc[:, i] & 0x0FFF) | (((d.astype(np.uint16) >> (4 * i)) & 0xF) << 12)
    blocks[:, 48:56] = sc.view(np.uint8)


def test_the_table_lists_every_format_with_the_packages_block_and_byte_sizes():
    listed = K.codec_types()
    assert [t[0] for t in listed] == sorted(TYPES, key=lambda n: int(T[n])), "fixed GGML type order"
    for name, ggml_type, block, size in listed:
        assert T(ggml_type).name == name
        assert (block, size) == GGML_QUANT_SIZES[T[name]]


@pytest.mark.parametrize("name", list(F16_FIELDS))
def test_random_blocks_decode_bit_identically_to_the_reference(name):
    assert_bit_identical(name, random_blocks(name, 3000, seed=int(T[name])))


@pytest.mark.parametrize("name", list(QUANTIZABLE))
def test_blocks_the_package_quantizes_decode_bit_identically(name):
    lo, hi = QUANTIZABLE[name]
    rng = np.random.default_rng(int(T[name]) + 100)
    block = GGML_QUANT_SIZES[T[name]][0]
    rows = 64
    # Rows of very different magnitudes: small ones push the scales into the subnormal range.
    data = rng.standard_normal((rows, 8 * max(block, 32))).astype(np.float32)
    data *= (10.0 ** rng.uniform(lo, hi, (rows, 1))).astype(np.float32)
    data[0] = 0.0
    q = np.ascontiguousarray(quants.quantize(data, T[name])).view(np.uint8)
    assert_bit_identical(name, q.reshape(-1, GGML_QUANT_SIZES[T[name]][1]))


@pytest.mark.parametrize("name", TYPES)
def test_single_block_decode_agrees_with_decode_blocks(name):
    blocks = random_blocks(name, 257, seed=7)
    a = K.codec_dequantize(int(T[name]), blocks)
    b = K._codec_decode_each(int(T[name]), blocks)
    assert np.array_equal(bits(a), bits(b))
    # and a span starting mid-row decodes as the same blocks did in the longer run
    block = GGML_QUANT_SIZES[T[name]][0]
    c = K.codec_dequantize(int(T[name]), blocks[100:103].copy())
    assert np.array_equal(bits(c), bits(a[100 * block:103 * block]))


# Formats with a lane-form decoder (codecs/codec.h, decode_lanes: 16 rows' blocks interleaved).
LANE_TYPES = list(F16_FIELDS)
# The byte range of a block each format's panels hold as 4-byte words (codecs/codec.h, lane_byte).
WORD_RANGES = {"Q4_K": (16, 144), "MXFP4": (1, 17)}


def interleave16(blocks: np.ndarray, name: str = "") -> np.ndarray:
    """[16n, bytes] blocks (row l of group g at 16g + l) -> [n, bytes * 16] as a panel of 16 rows
    stores them: byte i of row l's block at 16i + l, or in the word range [lo, hi), row l's 4-byte
    word w at 16lo + 64w + 4l."""
    n16, size = blocks.shape
    g = blocks.reshape(n16 // 16, 16, size)
    lo, hi = WORD_RANGES.get(name, (size, size))
    words = g[:, :, lo:hi].reshape(n16 // 16, 16, (hi - lo) // 4, 4).transpose(0, 2, 1, 3)
    return np.concatenate([g[:, :, :lo].transpose(0, 2, 1).reshape(n16 // 16, -1),
                           words.reshape(n16 // 16, -1),
                           g[:, :, hi:].transpose(0, 2, 1).reshape(n16 // 16, -1)], axis=1)


@pytest.mark.parametrize("name", LANE_TYPES)
def test_the_kernel_interleaves_16_blocks_as_the_panel_layout_says(name):
    blocks = random_blocks(name, 32, seed=int(T[name]) + 300)
    assert np.array_equal(K._codec_interleave16(int(T[name]), blocks), interleave16(blocks, name))


@pytest.mark.parametrize("name", LANE_TYPES)
def test_lane_form_decode_of_16_interleaved_rows_is_each_rows_reference(name):
    n = 200
    blocks = random_blocks(name, 16 * n, seed=int(T[name]) + 200)
    block = GGML_QUANT_SIZES[T[name]][0]
    got = K._codec_decode_lanes(int(T[name]), interleave16(blocks, name))  # [n, block, 16]
    with np.errstate(over="ignore"):
        ref = quants.dequantize(blocks.reshape(-1), T[name]).reshape(n, 16, block).transpose(0, 2, 1)
    assert got.shape == ref.shape
    diff = np.argwhere(bits(got) != bits(np.ascontiguousarray(ref)))
    if diff.size:
        g, k, l = diff[0]
        pytest.fail(f"{name}: {len(diff)} of {ref.size} weights differ; first: group {g}, weight {k}, lane {l}: "
                    f"got {got[g, k, l]!r}, reference {ref[g, k, l]!r}")


def test_lane_form_decode_refuses_a_wrong_width_naming_the_expected_bytes():
    with pytest.raises(ValueError, match=r"\[n, 544\] for Q8_0"):
        K._codec_decode_lanes(int(T.Q8_0), np.zeros((2, 34), dtype=np.uint8))


def test_an_unsupported_type_is_refused_by_name_listing_the_supported_ones():
    blocks = np.zeros((1, GGML_QUANT_SIZES[T.TQ2_0][1]), dtype=np.uint8)
    with pytest.raises(ValueError) as e:
        K.codec_dequantize(int(T.TQ2_0), blocks)
    msg = str(e.value)
    assert f"ggml_type {int(T.TQ2_0)}" in msg
    for name in TYPES:
        assert f"{name} ({int(T[name])})" in msg
    with pytest.raises(ValueError, match="ggml_type 9999"):
        K.codec_dequantize(9999, blocks)


def test_a_wrong_block_size_is_refused_naming_the_format_and_the_expected_bytes():
    with pytest.raises(ValueError, match=r"shape \(n, 34\) for Q8_0 .*2 dimensions, last 33"):
        K.codec_dequantize(int(T.Q8_0), np.zeros((2, 33), dtype=np.uint8))
    with pytest.raises(ValueError, match=r"shape \(n, 34\) for Q8_0 .*1 dimensions, last 34"):
        K.codec_dequantize(int(T.Q8_0), np.zeros(34, dtype=np.uint8))


def test_the_generated_tables_header_matches_the_installed_package():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_codec_tables.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
