// Q4_K: 256 weights per 144-byte block: f16 d, f16 dmin, 12 bytes of eight 6-bit (scale, min)
// pairs, 128 bytes of 4-bit codes. Sub-block s (32 weights): D = fl(d * sc_s), M = fl(dmin * m_s),
// w = fl(fl(D * q) - M).
#include "q_k_scales.h"

namespace cairn::codecs {
namespace {

inline void decode(const uint8_t* __restrict blk, float* __restrict out) {
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

}  // namespace

const BlockCodec Q4_K{"Q4_K", 12, 256, 144, decode, decode_each<decode, 256, 144>};

}  // namespace cairn::codecs
