// Q3_K: 256 weights per 110-byte block: 32 bytes of high-bit mask, 64 bytes of 2-bit low codes,
// 12 bytes of sixteen 6-bit scales, f16 d. Weight k = 128h + 32j + l: low = bits 2j..2j+1 of
// qs[32h + l], high = bit 4h + j of hmask[l]; q = low - (high ? 0 : 4) (the mask bit set means no
// offset); scale i = k / 16: (low nibble of byte i % 8, shifted by 4 for i >= 8) | (2 bits of byte
// 8 + i % 4 at 2(i / 4)) << 4, minus 32; w = fl(fl(d * scale) * q).
#include "../formats/lanes.h"
#include "codec_impl.h"

namespace cairn::codecs {
namespace {

inline void decode(const uint8_t* __restrict blk, float* __restrict out) {
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

// 16 rows at once (codec.h, decode_lanes): the same operations, one lane per row; each code and
// mask byte is loaded once for its four weights.
void decode_lanes(const uint8_t* __restrict b, float* __restrict out) {
  using namespace lanes;
  const uint8_t* sb = b + 16 * 96;
  const f32x16 d = half_to_f32(load_le16(b + 16 * 108));
  f32x16 D[16];
  for (int i = 0; i < 16; ++i) {
    const u32x16 lo = (load_u8(sb + 16 * (i % 8)) >> (4 * (i / 8))) & 0xFu;
    const u32x16 hi = (load_u8(sb + 16 * (8 + i % 4)) >> (2 * (i / 4))) & 3u;
    D[i] = d * to_f32((i32x16)((lo | (hi << 4)) - 32u));
  }
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 32; ++l) {
      const u32x16 q = load_u8(b + 16 * (32 + 32 * h + l)), m = load_u8(b + 16 * l);
      const int t = l < 16 ? 0 : 1;
      for (int j = 0; j < 4; ++j) {
        const u32x16 v = ((q >> (2 * j)) & 3u) - ((((m >> (4 * h + j)) & 1u) ^ 1u) << 2);
        store(out + 16 * (128 * h + 32 * j + l), D[8 * h + 2 * j + t] * to_f32((i32x16)v));
      }
    }
}

}  // namespace

const BlockCodec Q3_K{"Q3_K", 11, 256, 110, decode, decode_each<decode, 256, 110>, decode_lanes};

}  // namespace cairn::codecs
