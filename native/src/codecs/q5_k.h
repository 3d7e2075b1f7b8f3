// Q5_K: 256 weights per 176-byte block: f16 d, f16 dmin, 12 bytes of (scale, min) pairs as Q4_K,
// 32 bytes of high bits (bit s of byte 16 + l: weight l of sub-block s), 128 bytes of low nibbles as
// Q4_K at 48. q = low | high << 4; w = fl(fl(D * q) - M), fused where exact (q4_k.h).
#pragma once
#include "format.h"
#include "q4_k.h"
#include "q_k_scales.h"

namespace cairn::kq {

struct Q5K {
  static constexpr const char* kName = "Q5_K";
  static constexpr int kType = 13;
  static constexpr int kBlock = 256, kBytes = 176, kSub = 32, kGroup = 64, kParts = 2;

  static void decode(const uint8_t* __restrict blk, float* __restrict out) {
    using namespace codecs;
    const float d = f16_at(blk), dmin = f16_at(blk + 2);
    uint8_t sc[8], mn[8];
    k_scale_min(blk + 4, sc, mn);
    const uint8_t* qh = blk + 16;
    const uint8_t* qs = blk + 48;
    for (int c = 0; c < 4; ++c)
      for (int t = 0; t < 2; ++t) {
        const int s = 2 * c + t;
        const float D = d * (float)sc[s], M = dmin * (float)mn[s];
        float* o = out + 32 * s;
        for (int l = 0; l < 32; ++l) {
          const int q = ((qs[32 * c + l] >> (4 * t)) & 0xF) | (((qh[l] >> s) & 1) << 4);
          o[l] = D * (float)q - M;
        }
      }
  }

  static void scales(const uint8_t* b, f32x16* D, f32x16* M) { Q4K::scales(b, D, M); }
  struct Group {
    const uint8_t *q, *h;
    int s;  // the bit of part 0 (2 * (r / 64)); part 1's is s + 1
    const f32x16 *D, *M;
    template <int P>
    f32x16 at(int l) const {
      const u32x16 c = lanes::load_u8(q + 16 * l), hb = lanes::load_u8(h + 16 * l) >> s;
      const u32x16 v = P == 0 ? (c & 0xFu) | ((hb << 4) & 16u) : (c >> 4) | ((hb << 3) & 16u);
      return lanes::fmsub_exact(D[P], lanes::to_f32(v), M[P]);
    }
  };
  static Group group(const uint8_t* b, int r, const f32x16* D, const f32x16* M) {
    return {b + 16 * (48 + 32 * (r / 64)), b + 16 * 16, 2 * (r / 64), D, M};
  }
};

}  // namespace cairn::kq
