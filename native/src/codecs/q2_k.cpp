// Q2_K: 256 weights per 84-byte block: 16 bytes of 4-bit (scale, min) pairs (scale low nibble),
// 64 bytes of 2-bit codes, f16 d, f16 dmin. Weight k = 128h + 32j + l: q = bits 2j..2j+1 of
// qs[32h + l]; sub-block k / 16: D = fl(d * scale), M = fl(dmin * min), w = fl(fl(D * q) - M).
#include "codec_impl.h"

namespace cairn::codecs {
namespace {

inline void decode(const uint8_t* __restrict blk, float* __restrict out) {
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

}  // namespace

const BlockCodec Q2_K{"Q2_K", 10, 256, 84, decode, decode_each<decode, 256, 84>};

}  // namespace cairn::codecs
