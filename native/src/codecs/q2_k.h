// Q2_K: 256 weights per 84-byte block: 16 bytes of 4-bit (scale, min) pairs (scale low nibble),
// 64 bytes of 2-bit codes at 16, f16 d, f16 dmin at 80, 82. Weight k = 128h + 32j + 16t + l
// (l < 16): q = bits 2j..2j+1 of qs[32h + 16t + l]; sub-block k / 16: D = fl(d * scale),
// M = fl(dmin * min), w = fl(fl(D * q) - M), fused where exact (q4_k.h). A group is the 128 columns
// of one h, its part P = 2j + t.
#pragma once
#include "format.h"

namespace cairn::kq {

struct Q2K {
  static constexpr const char* kName = "Q2_K";
  static constexpr int kType = 10;
  static constexpr int kBlock = 256, kBytes = 84, kSub = 16, kGroup = 128, kParts = 8;

  static void decode(const uint8_t* __restrict blk, float* __restrict out) {
    using namespace codecs;
    const uint8_t* scales = blk;
    const uint8_t* qs = blk + 16;
    const float d = f16_at(blk + 80), dmin = f16_at(blk + 82);
    for (int h = 0; h < 2; ++h)
      for (int j = 0; j < 4; ++j) {
        // 32 weights, two scales: 32-wide loops are what the vectorizer turns into whole registers.
        const int s = 8 * h + 2 * j;
        const float D0 = d * (float)(scales[s] & 0xF), M0 = dmin * (float)(scales[s] >> 4);
        const float D1 = d * (float)(scales[s + 1] & 0xF), M1 = dmin * (float)(scales[s + 1] >> 4);
        const uint8_t* q = qs + 32 * h;
        float* o = out + 128 * h + 32 * j;
        for (int l = 0; l < 32; ++l) {
          const float qf = (float)((q[l] >> (2 * j)) & 3);
          o[l] = (l < 16 ? D0 : D1) * qf - (l < 16 ? M0 : M1);
        }
      }
  }

  static void scales(const uint8_t* b, f32x16* D, f32x16* M) {
    const f32x16 d = lanes::half_to_f32(lanes::load_le16(b + 16 * 80)), dmin = lanes::half_to_f32(lanes::load_le16(b + 16 * 82));
    for (int s = 0; s < 16; ++s) {
      const u32x16 sc = lanes::load_u8(b + 16 * s);
      D[s] = d * lanes::to_f32(sc & 0xFu);
      M[s] = dmin * lanes::to_f32(sc >> 4);
    }
  }
  struct Group {
    const uint8_t* q;
    const f32x16 *D, *M;
    template <int P>
    f32x16 at(int l) const {
      return lanes::fmsub_exact(D[P], crumb(lanes::load_u8(q + 16 * (16 * (P & 1) + l)) >> (2 * (P / 2))), M[P]);
    }
  };
  static Group group(const uint8_t* b, int r, const f32x16* D, const f32x16* M) {
    return {b + 16 * (16 + 32 * (r / 128)), D, M};
  }
};

}  // namespace cairn::kq
