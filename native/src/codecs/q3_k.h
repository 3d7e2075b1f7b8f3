// Q3_K: 256 weights per 110-byte block: 32 bytes of high-bit mask, 64 bytes of 2-bit low codes at
// 32, 12 bytes of sixteen 6-bit scales at 96, f16 d at 108. Weight k = 128h + 32j + 16t + l (l < 16):
// low = bits 2j..2j+1 of qs[32h + 16t + l], high = bit 4h + j of hmask[16t + l]; q = low - (high ? 0
// : 4) (the mask bit set means no offset); scale i = k / 16: (low nibble of byte i % 8, shifted by 4
// for i >= 8) | (2 bits of byte 8 + i % 4 at 2(i / 4)) << 4, minus 32; w = fl(fl(d * scale) * q), no
// min. A group is the whole block (part 8h + 2j + t), so the mask's bit is a constant too. On AVX-512
// q comes from a table indexed by low | mask << 2, like nibble().
#pragma once
#include "format.h"

namespace cairn::kq {

struct Q3K {
  static constexpr const char* kName = "Q3_K";
  static constexpr int kType = 11;
  static constexpr int kBlock = 256, kBytes = 110, kSub = 16, kGroup = 256, kParts = 16;

  static void decode(const uint8_t* __restrict blk, float* __restrict out) {
    using namespace codecs;
    const uint8_t* hmask = blk;
    const uint8_t* qs = blk + 32;
    const uint8_t* sb = blk + 96;
    const float d = f16_at(blk + 108);
    float D[16];
    for (int i = 0; i < 16; ++i) {
      const int lo = (sb[i % 8] >> (4 * (i / 8))) & 0xF;
      const int hi = (sb[8 + i % 4] >> (2 * (i / 4))) & 3;
      D[i] = d * (float)((lo | (hi << 4)) - 32);
    }
    for (int h = 0; h < 2; ++h)
      for (int j = 0; j < 4; ++j) {
        const float D0 = D[8 * h + 2 * j], D1 = D[8 * h + 2 * j + 1];   // 32 weights, two scales
        const uint8_t* q = qs + 32 * h;
        const int bit = 4 * h + j;
        float* o = out + 128 * h + 32 * j;
        for (int l = 0; l < 32; ++l) {
          const int v = ((q[l] >> (2 * j)) & 3) - ((((hmask[l] >> bit) & 1) ^ 1) << 2);
          o[l] = (l < 16 ? D0 : D1) * (float)v;
        }
      }
  }

  static void scales(const uint8_t* b, f32x16* D, f32x16*) {
    const uint8_t* sb = b + 16 * 96;
    const f32x16 d = lanes::half_to_f32(lanes::load_le16(b + 16 * 108));
    for (int i = 0; i < 16; ++i) {
      const u32x16 lo = (lanes::load_u8(sb + 16 * (i % 8)) >> (4 * (i / 8))) & 0xFu;
      const u32x16 hi = (lanes::load_u8(sb + 16 * (8 + i % 4)) >> (2 * (i / 4))) & 3u;
      D[i] = d * lanes::to_f32((i32x16)((lo | (hi << 4)) - 32u));
    }
  }
  struct Group {
    const uint8_t* b;
    const f32x16* D;
    template <int P>
    f32x16 at(int l) const {
      constexpr int h = P / 8, j = (P / 2) & 3, bit = 4 * h + j, o = 16 * (P & 1);
      const u32x16 lo = lanes::load_u8(b + 16 * (32 + 32 * h + o + l)) >> (2 * j), hm = lanes::load_u8(b + 16 * (o + l));
      f32x16 v;
      if constexpr (lanes::kLookupPermutes) {
        const f32x16 t = {-4, -3, -2, -1, 0, 1, 2, 3, -4, -3, -2, -1, 0, 1, 2, 3};
        v = lanes::lookup(t, (lo & 3u) | (shift<2 - bit>(hm) & 4u));
      } else {
        v = lanes::to_f32((i32x16)((lo & 3u) - ((((hm >> bit) & 1u) ^ 1u) << 2)));
      }
      return D[P] * v;
    }
  };
  static Group group(const uint8_t* b, int, const f32x16* D, const f32x16*) { return {b, D}; }
};

}  // namespace cairn::kq
