// cairn kernel: bounds of the x rows of a product, for the scaled chain's exactness check
// (pow2_chain.h): what a caller running many panel groups over the same rows makes once (kernels.h,
// packed_panels).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cairn/kernels.h"
#include "widen.h"

namespace cairn {

// Bounds of |v| over values' bit patterns: hi the largest |v|'s bits, lo the smallest nonzero |v|'s
// bits minus one (0xffffffff when all are zero).
struct MagRange {
  uint32_t hi = 0, lo = 0xffffffffu;
  void add(const float* v, int n) {
    // 8 lanes at a time (one ymm on AVX2, two xmm on v2: unsigned min / max), then the tail
    typedef uint32_t u32x8 __attribute__((vector_size(32)));
    u32x8 h = u32x8{} + hi, l = u32x8{} + lo;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
      u32x8 b;
      std::memcpy(&b, v + i, 32);
      b &= 0x7fffffffu;
      h = b > h ? b : h;
      b -= 1u;  // 0 wraps to the largest
      l = b < l ? b : l;
    }
    for (int q = 0; q < 8; ++q) hi = std::max(hi, h[q]), lo = std::min(lo, l[q]);
    for (; i < n; ++i) {
      uint32_t b;
      std::memcpy(&b, v + i, 4);
      b &= 0x7fffffffu;
      hi = std::max(hi, b), lo = std::min(lo, b - 1u);
    }
  }
  void add(const MagRange& o) { hi = std::max(hi, o.hi), lo = std::min(lo, o.lo); }
  bool finite() const { return hi < 0x7f800000u; }
  bool any() const { return lo != 0xffffffffu; }
  int hi_exp() const { return (int)(hi >> 23) - 126; }              // |v| < 2^hi_exp()
  int lo_quantum() const { return std::max((int)((lo + 1u) >> 23), 1) - 150; }  // nonzero v: multiples of 2^this
};

// The x rows' bounds per span (kSpanCols columns), for every product over the same rows
// (kernels.h, packed_panels): computed once per call of linear() rather than once per panel group.
struct Pow2Rows {
  std::vector<MagRange> span;
  void init(const float* const* x, int M, int K) {
    span.assign((K + kSpanCols - 1) / kSpanCols, MagRange{});
    for (int i = 0; i < M; ++i)
      for (size_t s = 0; s < span.size(); ++s)
        span[s].add(x[i] + s * kSpanCols, std::min(kSpanCols, K - (int)s * kSpanCols));
  }
};
// Whether L's panels have a scaled-chain form (packed.cpp).
bool pow2_format(const Linear& L);

}  // namespace cairn
