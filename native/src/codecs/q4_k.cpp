// Q4_K: 256 weights per 144-byte block: f16 d, f16 dmin, 12 bytes of eight 6-bit (scale, min)
// pairs, 128 bytes of 4-bit codes. Sub-block s (32 weights): D = fl(d * sc_s), M = fl(dmin * m_s),
// w = fl(fl(D * q) - M). In a panel the code bytes are 4-byte words (codec.h, lane_byte).
#include "../formats/lanes.h"
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

// 16 rows at once (codec.h, decode_lanes): the same operations, one lane per row.
void decode_lanes(const uint8_t* __restrict b, float* __restrict out) {
  using namespace lanes;
  const f32x16 d = half_to_f32(load_le16(b)), dmin = half_to_f32(load_le16(b + 16 * 2));
  f32x16 D[8], M[8];
  k_scale_min_lanes(b + 16 * 4, d, dmin, D, M);
  const uint8_t* qs = b + 16 * 16;
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; l += 4) {
      const u32x16 w = load_words(qs + 16 * (32 * c + l));  // code bytes 32c + l .. + 3
      for (int t = 0; t < 4; ++t) {
        const u32x16 q = w >> (8 * t);
        store(out + 16 * (64 * c + l + t), D[2 * c] * to_f32(q & 0xFu) - M[2 * c]);
        store(out + 16 * (64 * c + 32 + l + t), D[2 * c + 1] * to_f32((q >> 4) & 0xFu) - M[2 * c + 1]);
      }
    }
}

}  // namespace

const BlockCodec Q4_K{"Q4_K", 12, 256, 144, decode, decode_each<decode, 256, 144>, decode_lanes, 16, 144};

}  // namespace cairn::codecs
