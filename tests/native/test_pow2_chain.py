"""A power-of-two block scale on the accumulator, not on the weights (native/src/formats/pow2_chain.h,
issue 41 §4): MXFP4, official FP4 and FP8 panels in decode (M <= kPackM rows) scale the accumulator by
2^-s at each block and accumulate the codes unscaled. The result must be today's bits — the fp32 path's
on the dequantized weights — for every input: on random panels with adversarial scales (tiny, huge,
mixed), zero codes, zero / subnormal / huge / non-finite inputs and blocks whose partial sums cancel,
at decode and prefill shapes. Spans where the exactness check fails keep today's path; the counters
show which path ran, and the unguarded mode shows the check is what keeps the adversarial cases exact."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

import cairn._kernel as K
from cairn.daemon.modelgen.quantize import dequantize_fp4, dequantize_fp8

ROWS = (1, 2, 3, 5, 17)  # decode tiles (<= kPackM: 3 on AVX2, 6 on AVX-512) and prefill tiles


@pytest.fixture(autouse=True)
def pow2_on():
    K._pow2_chain(True, unguarded=False)
    yield
    K._pow2_chain(True, unguarded=False)


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32)


def reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Today's bits: the fp32 panels of the dequantized weights (-0 as +0, as the panels' code 8)."""
    return K._packed_matmul(x, (w + np.float32(0)).astype(np.float32))[0]


def mxfp4_blocks(n_rows: int, k: int, e: np.ndarray, rng, zero_frac: float = 0.0) -> np.ndarray:
    """[n_rows, k / 32 * 17] MXFP4 blocks: random codes, e8m0 bytes e (broadcast), some blocks all zero."""
    nb = k // 32
    b = rng.integers(0, 256, (n_rows, nb, 17), dtype=np.uint8)
    b[:, :, 0] = np.broadcast_to(e, (n_rows, nb))
    if zero_frac:
        z = rng.random((n_rows, nb)) < zero_frac
        b[z, 1:] = 0
    return b.reshape(n_rows, nb * 17)


def run_mxfp4(x, blocks):
    return K._ggml_matmul(x, blocks, "MXFP4")[0]


def mxfp4_weights(blocks):
    with np.errstate(over="ignore"):  # scale bytes of 255 (2^127) overflow to inf, in the panels too
        return dequantize(blocks.reshape(-1), T.MXFP4).reshape(blocks.shape[0], -1).astype(np.float32)


def inputs(kind: str, m: int, k: int, rng) -> np.ndarray:
    x = rng.standard_normal((m, k)).astype(np.float32)
    if kind == "ints":  # nonzero |x| >= 1: every product a multiple of 2^-23 * 2^s
        x = rng.integers(-8, 9, (m, k)).astype(np.float32)
    elif kind == "all-subnormal":
        x = (rng.integers(1, 2**20, (m, k)) * rng.choice([-1, 1], (m, k))).astype(np.float32) * np.float32(2.0 ** -149)
    elif kind == "zeros":
        x[rng.random((m, k)) < 0.5] = 0
    elif kind == "subnormal":
        x[:, ::7] = np.float32(1e-40) * rng.choice([-1, 1], size=x[:, ::7].shape)
    elif kind == "tiny":
        x *= np.float32(2.0 ** -100)
    elif kind == "huge":
        x *= np.float32(2.0 ** 100)
    elif kind == "inf":
        x[0, 40] = np.inf
    elif kind == "nan":
        x[-1, 600] = np.nan
    return x


def check(run, x, ref, expect_scaled: bool | None):
    K._pow2_chain(reset=True)
    y = run(x)
    st = K._pow2_chain()
    assert np.array_equal(bits(y), bits(ref)), f"{int((bits(y) != bits(ref)).sum())} outputs differ from today's bits"
    if expect_scaled is True and x.shape[0] <= 3:
        assert st["scaled"] > 0 and st["kept"] == 0, st
    if expect_scaled is False and x.shape[0] <= 3:
        assert st["kept"] > 0, st
    return st


# (name, e8m0 bytes per block column, zero-block fraction, input kind, whether decode takes the scaled chain)
MXFP4_CASES = [
    ("trained", lambda r, nb: r.integers(116, 124, nb), 0.0, "normal", True),
    ("zero-codes", lambda r, nb: r.integers(116, 124, nb), 0.3, "zeros", True),
    ("smallest-exact", lambda r, nb: np.full(nb, 2), 0.0, "ints", True),   # today's sums are subnormal
    ("large", lambda r, nb: r.integers(180, 200, nb), 0.0, "normal", True),
    ("subnormal-scale", lambda r, nb: r.integers(0, 2, nb), 0.0, "normal", False),
    ("overflowing", lambda r, nb: r.integers(250, 256, nb), 0.0, "normal", False),
    ("wide-range", lambda r, nb: r.choice([3, 250], nb), 0.0, "normal", False),
    ("subnormal-x", lambda r, nb: r.integers(116, 124, nb), 0.0, "subnormal", False),
    ("tiny-x", lambda r, nb: r.integers(100, 110, nb), 0.0, "tiny", False),
    ("huge-x", lambda r, nb: r.integers(170, 190, nb), 0.0, "huge", False),
    ("inf-x", lambda r, nb: r.integers(116, 124, nb), 0.0, "inf", False),
    ("nan-x", lambda r, nb: r.integers(116, 124, nb), 0.0, "nan", False),
]


@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("case", MXFP4_CASES, ids=[c[0] for c in MXFP4_CASES])
def test_mxfp4_gives_todays_bits(case, m):
    _, scales, zf, kind, scaled = case
    rng = np.random.default_rng(zlib.crc32(f"{case[0]}-{m}".encode()))
    n, k = 96, 1536
    blocks = mxfp4_blocks(n, k, scales(rng, k // 32), rng, zf)
    x = inputs(kind, m, k, rng)
    check(lambda x: run_mxfp4(x, blocks), x, reference(x, mxfp4_weights(blocks)), scaled)
    K._pow2_chain(False)  # and today's path itself, spans unchanged
    assert np.array_equal(bits(run_mxfp4(x, blocks)), bits(reference(x, mxfp4_weights(blocks))))


def cancelling(k: int, e_first: int, e_rest: int, rng):
    """One row whose first block's partial sums are huge and cancel exactly, the rest small: a span
    whose sums cross far down the exponent range (w = +-12 * 2^s pairs against equal x)."""
    nb = k // 32
    b = np.zeros((16, nb, 17), np.uint8)
    b[:, :, 0] = e_rest
    b[:, 0, 0] = e_first
    b[:, 0, 1:] = 0x77  # codes 7 (+12): columns 0-15 and 16-31 alike
    b[:, 0, 9:] = 0xFF  # codes 15 (-12) for columns 8-15 and 24-31
    b[:, 1:, 1:] = rng.integers(0, 256, (16, nb - 1, 16), dtype=np.uint8)
    x = rng.standard_normal((1, k)).astype(np.float32)
    x[0, 8:16] = x[0, 0:8]
    x[0, 24:32] = x[0, 16:24]
    return b.reshape(16, nb * 17), x


@pytest.mark.parametrize("e_first,e_rest,scaled", [(127, 2, False), (250, 120, False), (130, 126, True)])
def test_mxfp4_cancelling_sums(e_first, e_rest, scaled):
    rng = np.random.default_rng(e_first * 256 + e_rest)
    blocks, x = cancelling(512 * 2, e_first, e_rest, rng)
    check(lambda x: run_mxfp4(x, blocks), x, reference(x, mxfp4_weights(blocks)), scaled)


def test_the_check_is_what_keeps_adversarial_spans_exact():
    """Without pow2_exact() the scaled chain gives other bits on inputs it refuses: today's sums round
    in the subnormal range (x * 2^-8 below 2^-149's multiples) or overflow where the scaled ones do not."""
    rng = np.random.default_rng(5)
    k = 1024
    cases = [(mxfp4_blocks(32, k, np.full(k // 32, 120), rng), inputs("all-subnormal", 1, k, rng)),
             (mxfp4_blocks(32, k, np.full(k // 32, 250), rng), inputs("huge", 1, k, rng))]
    for blocks, x in cases:
        ref = reference(x, mxfp4_weights(blocks))
        K._pow2_chain(reset=True)
        assert np.array_equal(bits(run_mxfp4(x, blocks)), bits(ref))
        assert K._pow2_chain()["kept"] > 0
        K._pow2_chain(unguarded=True)
        y = run_mxfp4(x, blocks)
        assert K._pow2_chain()["scaled"] > 0
        assert not np.array_equal(bits(y), bits(ref))
        K._pow2_chain(unguarded=False)


def official(fmt: str, n: int, k: int, ue8m0, rng, zero_frac: float = 0.0):
    """(codes, scale bytes, fp32 weights) of an official FP4 ([n, k/2], [n, k/32]) or FP8 ([n, k],
    [ceil(n/128), ceil(k/128)]) matrix with scale bytes drawn by ue8m0(rng, shape)."""
    if fmt == "FP4":
        codes = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
        codes[rng.random((n, k // 2)) < zero_frac] = 0
        scales = ue8m0(rng, (n, k // 32)).astype(np.uint8)
        return codes, scales, dequantize_fp4(codes, scales)
    codes = rng.integers(0, 256, (n, k), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x7E  # the NaN pattern: the panels read it as 480 (lanes.h)
    codes[rng.random((n, k)) < zero_frac] = 0x80
    scales = ue8m0(rng, (-(-n // 128), -(-k // 128))).astype(np.uint8)
    return codes, scales, dequantize_fp8(codes, scales)


OFFICIAL_CASES = [
    ("trained", lambda r, s: r.integers(118, 126, s), 0.0, "normal", True),
    ("zero-codes", lambda r, s: r.integers(118, 126, s), 0.3, "zeros", True),
    ("small", lambda r, s: r.integers(12, 17, s), 0.0, "ints", True),  # today's sums near the subnormals
    ("large", lambda r, s: r.integers(200, 220, s), 0.0, "normal", True),
    ("subnormal-range", lambda r, s: r.integers(0, 2, s), 0.0, "normal", False),
    ("overflowing", lambda r, s: np.full(s, 246), 0.0, "huge", False),
    ("wide-range", lambda r, s: r.choice([1, 246], s), 0.0, "normal", False),
    ("subnormal-x", lambda r, s: r.integers(118, 126, s), 0.0, "subnormal", False),
    ("nan-x", lambda r, s: r.integers(118, 126, s), 0.0, "nan", False),
]


@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("case", OFFICIAL_CASES, ids=[c[0] for c in OFFICIAL_CASES])
@pytest.mark.parametrize("fmt", ["FP4", "FP8"])
def test_official_panels_give_todays_bits(fmt, case, m):
    _, ue8m0, zf, kind, scaled = case
    rng = np.random.default_rng(zlib.crc32(f"{fmt}-{case[0]}-{m}".encode()))
    n, k = 80, 1536 if fmt == "FP4" else 1216  # FP8: a last block of 64 columns
    codes, scales, w = official(fmt, n, k, ue8m0, rng, zf)
    x = inputs(kind, m, k, rng)
    check(lambda x: K._qfmt_matmul(x, codes, scales, fmt)[0], x, reference(x, w), scaled)


def test_decode_rows_match_prefill_rows():
    """One row through the decode tile (scaled chain) and the same row inside a prefill tile (today's
    chain over widened weights) give the same bits."""
    rng = np.random.default_rng(3)
    k = 2048
    blocks = mxfp4_blocks(64, k, rng.integers(110, 130, k // 32), rng)
    x = rng.standard_normal((24, k)).astype(np.float32)
    K._pow2_chain(reset=True)
    one = np.concatenate([run_mxfp4(x[i:i + 1], blocks) for i in range(24)])
    assert K._pow2_chain()["scaled"] > 0
    assert np.array_equal(bits(one), bits(run_mxfp4(x, blocks)))


def test_qfmt_matmul_rejects_bad_shapes():
    x = np.zeros((1, 64), np.float32)
    with pytest.raises(ValueError, match="fmt must be FP4 or FP8"):
        K._qfmt_matmul(x, np.zeros((16, 32), np.uint8), np.zeros((16, 2), np.uint8), "FP6")
    with pytest.raises(ValueError, match="scales"):
        K._qfmt_matmul(x, np.zeros((16, 32), np.uint8), np.zeros((16, 3), np.uint8), "FP4")
