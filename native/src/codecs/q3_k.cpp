// Q3_K: 256 weights per 110-byte block: 32 bytes of high-bit mask, 64 bytes of 2-bit low codes,
// 12 bytes of sixteen 6-bit scales, f16 d. Weight k = 128h + 32j + l: low = bits 2j..2j+1 of
// qs[32h + l], high = bit 4h + j of hmask[l]; q = low - (high ? 0 : 4) (the mask bit set means no
// offset); scale i = k / 16: (low nibble of byte i % 8, shifted by 4 for i >= 8) | (2 bits of byte
// 8 + i % 4 at 2(i / 4)) << 4, minus 32; w = fl(fl(d * scale) * q).
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

}  // namespace

const BlockCodec Q3_K{"Q3_K", 11, 256, 110, decode, decode_each<decode, 256, 110>};

}  // namespace cairn::codecs
