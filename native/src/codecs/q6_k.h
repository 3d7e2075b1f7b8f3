// Q6_K: 256 weights per 210-byte block: 128 bytes of low nibbles, 64 bytes of 2-bit high parts at
// 128, 16 int8 scales at 192, f16 d at 208. Weight k = 128h + 32j + l (h < 2, j < 4, l < 32):
// low = nibble (j / 2) of ql[64h + 32(j % 2) + l], high = bits 2j..2j+1 of qh[32h + l];
// q = (low | high << 4) - 32, w = fl(fl(d * scale[k / 16]) * q). A group is the 128 columns of one
// h, its part P = 2j + t for columns 16t + l.
#pragma once
#include "format.h"

namespace cairn::kq {

struct Q6K {
  static constexpr const char* kName = "Q6_K";
  static constexpr int kType = 14;
  static constexpr int kBlock = 256, kBytes = 210, kSub = 16, kGroup = 128, kParts = 8;

  static void decode(const uint8_t* __restrict blk, float* __restrict out) {
    using namespace codecs;
    const uint8_t* ql = blk;
    const uint8_t* qh = blk + 128;
    const int8_t* scales = reinterpret_cast<const int8_t*>(blk + 192);
    const float d = f16_at(blk + 208);
    for (int h = 0; h < 2; ++h)
      for (int j = 0; j < 4; ++j) {
        const float D0 = d * (float)scales[8 * h + 2 * j], D1 = d * (float)scales[8 * h + 2 * j + 1];
        const uint8_t* lo = ql + 64 * h + 32 * (j & 1);
        const uint8_t* hi = qh + 32 * h;
        float* o = out + 128 * h + 32 * j;
        for (int l = 0; l < 32; ++l) {   // 32 weights, two scales
          const int q = (((lo[l] >> (4 * (j >> 1))) & 0xF) | (((hi[l] >> (2 * j)) & 3) << 4)) - 32;
          o[l] = (l < 16 ? D0 : D1) * (float)q;
        }
      }
  }

  static void scales(const uint8_t* b, f32x16* D, f32x16*) {
    const f32x16 d = lanes::half_to_f32(lanes::load_le16(b + 16 * 208));
    for (int s = 0; s < 16; ++s) D[s] = d * lanes::to_f32(lanes::load_i8(b + 16 * (192 + s)));
  }
  struct Group {
    const uint8_t *lo, *hi;
    const f32x16* D;
    template <int P>
    f32x16 at(int l) const {
      constexpr int j = P / 2, t = P & 1;
      const u32x16 a = lanes::load_u8(lo + 16 * (32 * (j & 1) + 16 * t + l)) >> (4 * (j >> 1));
      const u32x16 c = lanes::load_u8(hi + 16 * (16 * t + l));
      const u32x16 q = ((a & 0xFu) | (shift<4 - 2 * j>(c) & 0x30u)) - 32u;
      return D[P] * lanes::to_f32((i32x16)q);
    }
  };
  static Group group(const uint8_t* b, int r, const f32x16* D, const f32x16*) {
    const int h = r / 128;
    return {b + 16 * (64 * h), b + 16 * (128 + 32 * h), D};
  }
};

}  // namespace cairn::kq
