// Q4_K: 256 weights per 144-byte block: f16 d, f16 dmin, 12 bytes of eight 6-bit (scale, min)
// pairs (q_k_scales.h), 128 bytes of 4-bit codes. Sub-block s (32 weights): D = fl(d * sc_s),
// M = fl(dmin * m_s), w = fl(fl(D * q) - M). Sub-block s is nibble s & 1 of code bytes
// 16 + 32(s / 2) + l: a group is the 64 columns of 32 code bytes, held in a panel as words (codec.h,
// lane_byte): column l's codes are a shift of word l / 4, one load for four columns.
//
// One fusion is explicit: D * q is exact in fp32 (an f16 d, 11 significant bits, times a scale of
// at most 6 bits and a code of at most 5: <= 22 bits, far from fp32's range limits), so
// fl(D * q - M) in one rounding is fl(fl(D * q) - M), and AVX-512 and FMA3 take it as one fused
// multiply-subtract (lanes::fmsub_exact). Q2_K and Q5_K lean on the same argument.
#pragma once
#include "format.h"
#include "q_k_scales.h"

namespace cairn::kq {

struct Q4K {
  static constexpr const char* kName = "Q4_K";
  static constexpr int kType = 12;
  static constexpr int kBlock = 256, kBytes = 144, kSub = 32, kGroup = 64, kParts = 2;
  static constexpr int kWordsLo = 16, kWordsHi = 144;

  static void decode(const uint8_t* __restrict blk, float* __restrict out) {
    using namespace codecs;
    const float d = f16_at(blk), dmin = f16_at(blk + 2);
    uint8_t sc[8], mn[8];
    k_scale_min(blk + 4, sc, mn);
    const uint8_t* qs = blk + 16;
    for (int c = 0; c < 4; ++c)          // 32 code bytes: low nibbles are sub-block 2c, high ones 2c+1
      for (int t = 0; t < 2; ++t) {
        const int s = 2 * c + t;
        const float D = d * (float)sc[s], M = dmin * (float)mn[s];
        float* o = out + 32 * s;
        for (int l = 0; l < 32; ++l) o[l] = D * (float)((qs[32 * c + l] >> (4 * t)) & 0xF) - M;
      }
  }

  static void scales(const uint8_t* b, f32x16* D, f32x16* M) {
    const f32x16 d = lanes::half_to_f32(lanes::load_le16(b)), dmin = lanes::half_to_f32(lanes::load_le16(b + 16 * 2));
    codecs::k_scale_min_lanes(b + 16 * 4, d, dmin, D, M);
  }
  struct Group {
    const uint8_t* q;
    const f32x16 *D, *M;
    static constexpr int kWordCols = 4;
    template <int P, int S>  // column l + S, l a multiple of 4
    f32x16 at(int l) const { return lanes::fmsub_exact(D[P], nibble(lanes::load_words(q + 16 * l) >> (8 * S + 4 * P)), M[P]); }
  };
  static Group group(const uint8_t* b, int r, const f32x16* D, const f32x16* M) {
    return {b + 16 * (16 + 32 * (r / 64)), D, M};
  }
};

}  // namespace cairn::kq
