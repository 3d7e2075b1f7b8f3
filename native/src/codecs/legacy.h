// llama.cpp's first 32-weight formats, what `llama-quantize` falls back to when a row is not whole
// 256-weight blocks (V4's indexer position bias is 128 wide: Q5_0 in a Q4_K_M file, Q4_0 in a Q2_K
// one). A block: f16 d, [f16 m], [a little-endian u32 of fifth bits], 16 code bytes whose low nibbles
// are weights 0-15 and high nibbles 16-31. Fifth bit j of the u32 goes on top of weight j's nibble.
//   Q4_0 (18 bytes): w = fl(d * (q - 8))      Q4_1 (20): w = fl(fl(d * q) + m)
//   Q5_0 (22 bytes): w = fl(d * (q - 16))     Q5_1 (24): w = fl(fl(d * q) + m)
// gguf.quants' order: the code becomes a (signed) integer first, then one product, then the sum.
//
// In lanes a group is the block, part 0 its columns 0-15 (low nibbles), part 1 columns 16-31 (high
// nibbles). Q4_0 / Q5_0: the value q - offset is exact in fp32, so on AVX-512 Q4_0's comes from a
// table (like Q3_K's) and Q5_0's by a convert and an exact subtraction. Q4_1 / Q5_1: d * q is exact
// (an f16 d times 4-5 bits), so fl(fl(d * q) + m) is one fused multiply-add (lanes::fmadd_exact).
#pragma once
#include "format.h"

namespace cairn::kq {

template <bool kMin, bool kHigh>
struct Legacy {
  static constexpr const char* kName = kMin ? (kHigh ? "Q5_1" : "Q4_1") : (kHigh ? "Q5_0" : "Q4_0");
  static constexpr int kType = kMin ? (kHigh ? 7 : 3) : (kHigh ? 6 : 2);
  static constexpr int kHighAt = kMin ? 4 : 2, kCodesAt = kHighAt + (kHigh ? 4 : 0);
  static constexpr int kBlock = 32, kBytes = kCodesAt + 16, kSub = 32, kGroup = 32, kParts = 2;
  static constexpr int kOffset = kMin ? 0 : (kHigh ? 16 : 8);  // with a min, codes are unsigned

  static void decode(const uint8_t* __restrict blk, float* __restrict out) {
    using namespace codecs;
    const float d = f16_at(blk), m = kMin ? f16_at(blk + 2) : 0.f;
    const uint32_t qh = kHigh ? le32(blk + kHighAt) : 0;
    const uint8_t* qs = blk + kCodesAt;
    for (int j = 0; j < 32; ++j) {
      const int q = ((qs[j % 16] >> (4 * (j / 16))) & 0xF) | (int)(((qh >> j) & 1) << 4);
      const float w = d * (float)(q - kOffset);
      out[j] = kMin ? w + m : w;
    }
  }

  static void scales(const uint8_t* b, f32x16* D, f32x16* M) {
    D[0] = lanes::half_to_f32(lanes::load_le16(b));
    if constexpr (kMin) M[0] = lanes::half_to_f32(lanes::load_le16(b + 16 * 2));
  }
  struct Group {
    const uint8_t* q;
    u32x16 qh;
    f32x16 d, m;
    template <int P>
    f32x16 at(int l) const {
      const u32x16 lo = lanes::load_u8(q + 16 * l) >> (4 * P);
      if constexpr (!kHigh && !kMin && lanes::kLookupPermutes) {
        const f32x16 t = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
        return d * lanes::lookup(t, lo);
      } else {
        u32x16 c = lo & 0xFu;
        if constexpr (kHigh) c |= ((qh >> (l + 16 * P)) & 1u) << 4;
        if constexpr (kMin) return lanes::fmadd_exact(d, lanes::to_f32(c), m);
        else return d * (lanes::to_f32(c) - (kHigh ? 16.f : 8.f));
      }
    }
  };
  static Group group(const uint8_t* b, int, const f32x16* D, const f32x16* M) {
    f32x16 m{};
    if constexpr (kMin) m = M[0];
    return {b + 16 * kCodesAt, kHigh ? lanes::load_le32(b + 16 * kHighAt) : u32x16{}, D[0], m};
  }
};
using Q40 = Legacy<false, false>;
using Q41 = Legacy<true, false>;
using Q50 = Legacy<false, true>;
using Q51 = Legacy<true, true>;

}  // namespace cairn::kq
