// Q6_K: 256 weights per 210-byte block: 128 bytes of low nibbles, 64 bytes of 2-bit high parts,
// 16 int8 scales, f16 d. Weight k = 128h + 32j + l (h < 2, j < 4, l < 32):
// low = nibble (j / 2) of ql[64h + 32(j % 2) + l], high = bits 2j..2j+1 of qh[32h + l];
// q = (low | high << 4) - 32, w = fl(fl(d * scale[k / 16]) * q).
#include "codec_impl.h"

namespace cairn::codecs {
namespace {

inline void decode(const uint8_t* __restrict blk, float* __restrict out) {
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

}  // namespace

const BlockCodec Q6_K{"Q6_K", 14, 256, 210, decode, decode_each<decode, 256, 210>};

}  // namespace cairn::codecs
