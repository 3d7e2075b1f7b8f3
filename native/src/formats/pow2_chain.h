// cairn kernel: a power-of-two block scale taken off the weights and put on the accumulator (issue 41
// §4), for the formats whose weight is a code times 2^s per lane and block: MXFP4 (e8m0 per 32), the
// official FP4 (ue8m0 per 32) and FP8 (ue8m0 per 128) panels.
//
// Design notes
//  * Today's chain is acc = fl(x * w + acc) with w = kv * 2^s (kv the code's value). The scaled chain
//    multiplies acc by 2^(s_prev - s) at each block's start (acc' = acc * 2^-s), accumulates
//    fl(x * kv + acc'), and multiplies by 2^s_last at the span's end: per block and panel one multiply
//    per row instead of one per column. packed.cpp's micro-kernel does it (columns(), W::kScaleCols).
//  * It gives today's bits when, in both scalings, every rounding is either in the normal range (where
//    rounding commutes with a power of two) or exact. A sum of floats that are all multiples of q is a
//    multiple of q, and so is its rounding; a value below 2^-126 that is a multiple of 2^-149 is a
//    subnormal, exactly. So it suffices that every operand of both chains is a multiple of 2^-149 and
//    that no value reaches 2^127. pow2_exact() checks that per span (kSpanCols columns), from bounds:
//    the quantum (least bit) of the nonzero x and of the accumulators at the span's start (from their
//    exponents), the codes' least bit and largest value (kQk, kMk), and the span's scale range. A span
//    that fails (tiny or huge scales, subnormal or huge inputs, inf / NaN) takes today's path; the bits
//    are the same either way, so decode, prefill (which stays on today's tile path), chunking and
//    restore agree unconditionally.
//  * The x bounds are one pass over x (vectorized min / max), made once per linear() call (Pow2Rows); a
//    caller of packed_panels without them pays it per panel group (kc floats a row next to np * 16 * kc
//    weights, a few per cent).
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../codecs/mxfp4_lanes.h"
#include "formats.h"
#include "ggml_widen.h"
#include "lanes.h"
#include "pow2_rows.h"
#include "widen.h"

namespace cairn {

// Spans computed on the scaled chain / kept on today's path (test hook and bench: bind_bench.cpp),
// and the switch that turns the scaled chain off (tests compare the two).
struct Pow2Stats {
  std::atomic<int64_t> scaled{0}, kept{0};
  std::atomic<bool> enabled{true};
  std::atomic<bool> unguarded{false};  // tests only: skip pow2_exact(), to show what it guards against
};
extern Pow2Stats g_pow2;

// The scaled chain over one span gives today's bits (design notes). s in [s_lo, s_hi] over the span's
// blocks and lanes; codes kv: multiples of 2^qk, |kv| < 2^mk; x over the span's columns; acc the
// accumulators at the span's start (empty at column 0); kc the span's columns.
inline bool pow2_exact(int s_lo, int s_hi, int qk, int mk, const MagRange& x, const MagRange& acc, int kc) {
  // the factors 2^-s0, 2^(s_prev - s), 2^s_last are normal floats; w = kv * 2^s is exact
  if (s_lo < -126 || s_hi > 126 || s_hi - s_lo > 126 || qk + s_lo < -149 || mk + s_hi > 126) return false;
  if (!x.finite() || !acc.finite()) return false;
  constexpr int kNone = 1 << 20;
  const int qx = x.any() ? x.lo_quantum() + qk : kNone;                     // x * kv
  const int qa = std::min(acc.any() ? acc.lo_quantum() : kNone, qx + s_lo);  // today's chain
  if (qx < -149 || qa < -149 || qa - s_hi < -149) return false;             // the scaled chain's
  int lg = 0;
  while ((1 << lg) < kc) ++lg;
  // |acc| <= |acc0| + kc max|x| max|w|, times < 2 for the roundings: below 2^top in today's chain
  const int top = std::max(acc.any() ? acc.hi_exp() : -kNone, x.any() ? x.hi_exp() + lg + mk + s_hi : -kNone) + 2;
  return top <= 127 && top - s_lo <= 127;
}

// Smallest and largest byte of nb groups of 16 (one a block, `step` bytes apart) of np panels
// (`ps` bytes apart).
inline void byte_range(const uint8_t* p, size_t ps, size_t step, int np, int nb, int& lo, int& hi) {
  lanes::u8x16 l, h;
  std::memcpy(&l, p, 16);
  h = l;
  for (int j = 0; j < np; ++j)
    for (int b = 0; b < nb; ++b) {
      lanes::u8x16 v;
      std::memcpy(&v, p + j * ps + b * step, 16);
      l = v < l ? v : l;
      h = v > h ? v : h;
    }
  lo = 255, hi = 0;
  for (int i = 0; i < 16; ++i) lo = std::min(lo, (int)l[i]), hi = std::max(hi, (int)h[i]);
}

// The rescaling factors of a span as exponent bytes (exp2_bytes: 2^(byte - 127)): f[j][b] for
// 2^(s(b-1) - s(b)) at block b's start (2^-s(0) at the first), f[j][nb] for 2^s(nb - 1), from the scale
// bytes E per lane (s = E - bias); pow2_exact() keeps every one in 1 .. 254. Bytes, not float vectors:
// GCC 12 stored 16-lane vectors built here through general registers, which cost a third of the time.
template <int G>
struct Pow2Factors {
  uint8_t f[kPackN][kSpanCols / G + 1][kPanel];
  int nb;
  // e(j, b): the 16 lanes' scale bytes of panel j's block b
  template <class E>
  void init(int np, int nb_, int bias, E&& e) {
    nb = nb_;
    for (int j = 0; j < np; ++j) {
      lanes::u8x16 prev = lanes::u8x16{} + (uint8_t)bias;
      for (int b = 0; b < nb; ++b) {
        lanes::u8x16 cur;
        std::memcpy(&cur, e(j, b), 16);
        const lanes::u8x16 d = prev - cur + (uint8_t)127;
        std::memcpy(f[j][b], &d, 16);
        prev = cur;
      }
      const lanes::u8x16 d = prev - (uint8_t)bias + (uint8_t)127;
      std::memcpy(f[j][nb], &d, 16);
    }
  }
  lanes::f32x16 at(int j, int b) const { return lanes::exp2_bytes(f[j][b]); }
  lanes::f32x16 last(int j) const { return lanes::exp2_bytes(f[j][nb]); }
};

// Whether a span (columns k0 .. k0 + kc, x's bounds xr) with accumulators out (M rows of ld, read
// when k0 > 0) may take the scaled chain, for scale bytes in [e_lo, e_hi] with s = E - bias.
inline bool pow2_span_exact(const MagRange& xr, int M, int k0, int kc, const float* out, int ld, int e_lo, int e_hi,
                            int bias, int qk, int mk) {
  MagRange ar;
  if (k0 > 0) ar.add(out, M * ld);
  return pow2_exact(e_lo - bias, e_hi - bias, qk, mk, xr, ar, kc);
}

// MXFP4 GGUF panels on the scaled chain: GgmlWiden's walk over the codes alone (codecs/mxfp4.h,
// MXFP4::Codes: w = kv * 2^(e - 128)).
struct Mxfp4Pow2 : GgmlWiden<kq::MXFP4::Codes> {
  static constexpr int kScaleCols = 32, kBias = 128, kQk = 0, kMk = 4;  // kv: integers, |kv| <= 12
  Pow2Factors<32> fac;
  Mxfp4Pow2(const Linear& L, int p0, int k0, int kc, int np) : GgmlWiden(L, p0, k0, kc, np) {
    fac.init(np, kc / 32, kBias, [&](int j, int b) { return blk(j, b); });
  }
  lanes::f32x16 rescale(int j, int k) const { return fac.at(j, k / kScaleCols); }
  lanes::f32x16 unscale(int j) const { return fac.last(j); }
  static bool exact(const MagRange& x, int M, const Linear& L, int p0, int np, int k0, int kc, const float* out,
                    int ld) {
    const size_t step = (size_t)kq::MXFP4::kBytes * kPanel, ps = (size_t)(L.in / kq::MXFP4::kBlock) * step;
    int lo, hi;
    byte_range(L.pq + (size_t)p0 * ps + (size_t)(k0 / 32) * step, ps, step, np, kc / 32, lo, hi);
    return pow2_span_exact(x, M, k0, kc, out, ld, lo, hi, kBias, kQk, kMk);
  }
};

// The scaled chain of a GGUF format, where it has one (packed.cpp tries it per span): void for none.
template <class Q>
struct GgmlPow2 {
  using type = void;
};
template <>
struct GgmlPow2<kq::MXFP4> {
  using type = Mxfp4Pow2;
};

// FP8 / FP4 panels (widen.h): the lane scales of a span as bytes, and the factors.
template <int G>
struct LanePow2 {
  const uint8_t* s;  // panel p0's scale bytes at the span's first group
  size_t ss;         // from one panel's to the next
  Pow2Factors<G> fac;
  LanePow2(const Linear& L, int p0, int k0, int kc, int np, int bias)
      : s(L.pqs + (size_t)p0 * ((L.in + G - 1) / G) * kPanel + (size_t)(k0 / G) * kPanel),
        ss((size_t)((L.in + G - 1) / G) * kPanel) {
    fac.init(np, (kc + G - 1) / G, bias, [&](int j, int b) { return s + j * ss + (size_t)b * kPanel; });
  }
  static bool exact(const MagRange& x, int M, const Linear& L, int p0, int np, int k0, int kc, const float* out,
                    int ld, int bias, int qk, int mk) {
    const size_t ss = (size_t)((L.in + G - 1) / G) * kPanel;
    int lo, hi;
    byte_range(L.pqs + (size_t)p0 * ss + (size_t)(k0 / G) * kPanel, ss, kPanel, np, (kc + G - 1) / G, lo, hi);
    return pow2_span_exact(x, M, k0, kc, out, ld, lo, hi, bias, qk, mk);
  }
};

// FP8 e4m3 codes times 2^-8 (lanes.h, e4m3_x256): multiples of 2^-17, below 2 (480 / 256 for the
// NaN pattern). Stored scale byte = ue8m0 + 8: w = kv * 2^(byte - 127), as Fp8Widen.
struct Fp8Pow2 {
  static constexpr int kScaleCols = kFp8Block, kBias = 127, kQk = -17, kMk = 1;
  const uint8_t* c;
  size_t cs;
  LanePow2<kFp8Block> sc;
  Fp8Pow2(const Linear& L, int p0, int k0, int kc, int np)
      : c(L.pq + ((size_t)p0 * L.in + k0) * kPanel), cs((size_t)L.in * kPanel), sc(L, p0, k0, kc, np, kBias) {}
  lanes::f32x16 operator()(int j, int k) const {
    const uint8_t* p = c + j * cs + (size_t)k * kPanel;
#if defined(__AVX2__) && defined(__F16C__) && !defined(__AVX512F__)
    // lanes::e4m3_x256's two halves, joined by a shuffle: its copy through memory reached the
    // micro-kernel's split unmultiplied, and GCC 12 took the upper half apart element by element
    // (half the speed of today's path)
    const __m128i b = _mm_loadu_si128((const __m128i*)p), mask = _mm_set1_epi16((short)0xBF80);
    const __m256 lo = _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(b), 7), mask));
    const __m256 hi = _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(_mm_srli_si128(b, 8)), 7), mask));
    return lanes::join((lanes::f32x8)lo, (lanes::f32x8)hi);
#else
    return lanes::e4m3_x256(p);
#endif
  }
  lanes::f32x16 rescale(int j, int k) const { return sc.fac.at(j, k / kScaleCols); }
  lanes::f32x16 unscale(int j) const { return sc.fac.last(j); }
  static bool exact(const MagRange& x, int M, const Linear& L, int p0, int np, int k0, int kc, const float* out,
                    int ld) {
    return LanePow2<kFp8Block>::exact(x, M, L, p0, np, k0, kc, out, ld, kBias, kQk, kMk);
  }
};

// FP4 e2m1 codes as MXFP4's doubled values (integers, |kv| <= 12; code 8 is +0 as in Fp4Widen). Stored
// scale byte = ue8m0 + 1 and Fp4Widen's w = (kv / 4) * 2^(byte - 127): s = byte - 129.
struct Fp4Pow2 {
  static constexpr int kScaleCols = kFp4Group, kBias = 129, kQk = 0, kMk = 4;
  const uint8_t* c;
  size_t cs;
  LanePow2<kFp4Group> sc;
  Fp4Pow2(const Linear& L, int p0, int k0, int kc, int np)
      : c(L.pq + ((size_t)p0 * L.in + k0) * (kPanel / 2)), cs((size_t)L.in * (kPanel / 2)), sc(L, p0, k0, kc, np, kBias) {}
  lanes::f32x16 operator()(int j, int k) const {
    const uint8_t* p = c + j * cs + (size_t)k * (kPanel / 2);
    if constexpr (lanes::kLookupPermutes) {
      return codecs::mxfp4::kvalue_lanes(lanes::load_nibbles(p));
    } else {
      return codecs::mxfp4::kvalue_bytes(lanes::nibbles8(p));
    }
  }
  lanes::f32x16 rescale(int j, int k) const { return sc.fac.at(j, k / kScaleCols); }
  lanes::f32x16 unscale(int j) const { return sc.fac.last(j); }
  static bool exact(const MagRange& x, int M, const Linear& L, int p0, int np, int k0, int kc, const float* out,
                    int ld) {
    return LanePow2<kFp4Group>::exact(x, M, L, p0, np, k0, kc, out, ld, kBias, kQk, kMk);
  }
};

}  // namespace cairn
