// Q8_0: 32 weights per 34-byte block: f16 scale d at 0, then 32 int8 codes. w = fl(d * q); a group
// is the block.
#pragma once
#include "format.h"

namespace cairn::kq {

struct Q80 {
  static constexpr const char* kName = "Q8_0";
  static constexpr int kType = 8;
  static constexpr int kBlock = 32, kBytes = 34, kSub = 32, kGroup = 32, kParts = 1;

  static void decode(const uint8_t* blk, float* out) {
    const float d = codecs::f16_at(blk);
    const int8_t* q = reinterpret_cast<const int8_t*>(blk + 2);
    for (int i = 0; i < 32; ++i) out[i] = d * (float)q[i];
  }

  static void scales(const uint8_t* b, f32x16* D, f32x16*) { D[0] = lanes::half_to_f32(lanes::load_le16(b)); }
  struct Group {
    const uint8_t* q;
    f32x16 d;
    template <int P>
    f32x16 at(int l) const { return d * lanes::to_f32(lanes::load_i8(q + 16 * l)); }
  };
  static Group group(const uint8_t* b, int, const f32x16* D, const f32x16*) { return {b + 16 * 2, D[0]}; }
};

}  // namespace cairn::kq
