// Q5_K: 256 weights per 176-byte block: f16 d, f16 dmin, 12 bytes of (scale, min) pairs as Q4_K,
// 32 bytes of high bits (bit s of byte l: weight l of sub-block s), 128 bytes of low nibbles as Q4_K.
// q = low | high << 4; w = fl(fl(D * q) - M).
#include "../formats/lanes.h"
#include "q_k_scales.h"

namespace cairn::codecs {
namespace {

inline void decode(const uint8_t* __restrict blk, float* __restrict out) {
  const float d = f16_at(blk), dmin = f16_at(blk + 2);
  uint8_t sc[8], mn[8];
  k_scale_min(blk + 4, sc, mn);
  const uint8_t* qh = blk + 16;
  const uint8_t* qs = blk + 48;
  for (int c = 0; c < 4; ++c)
    for (int t = 0; t < 2; ++t) {
      const int s = 2 * c + t;
      const float D = d * (float)sc[s], M = dmin * (float)mn[s];
      float* o = out + 32 * s;
      for (int l = 0; l < 32; ++l) {
        const int q = ((qs[32 * c + l] >> (4 * t)) & 0xF) | (((qh[l] >> s) & 1) << 4);
        o[l] = D * (float)q - M;
      }
    }
}

// 16 rows at once (codec.h, decode_lanes): the same operations, one lane per row.
void decode_lanes(const uint8_t* __restrict b, float* __restrict out) {
  using namespace lanes;
  const f32x16 d = half_to_f32(load_le16(b)), dmin = half_to_f32(load_le16(b + 16 * 2));
  f32x16 D[8], M[8];
  k_scale_min_lanes(b + 16 * 4, d, dmin, D, M);
  const uint8_t* qh = b + 16 * 16;
  const uint8_t* qs = b + 16 * 48;
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      const u32x16 q = load_u8(qs + 16 * (32 * c + l)), h = load_u8(qh + 16 * l);
      const u32x16 q0 = (q & 0xFu) | (((h >> (2 * c)) & 1u) << 4), q1 = (q >> 4) | (((h >> (2 * c + 1)) & 1u) << 4);
      store(out + 16 * (64 * c + l), D[2 * c] * to_f32(q0) - M[2 * c]);
      store(out + 16 * (64 * c + 32 + l), D[2 * c + 1] * to_f32(q1) - M[2 * c + 1]);
    }
}

}  // namespace

const BlockCodec Q5_K{"Q5_K", 13, 256, 176, decode, decode_each<decode, 256, 176>, decode_lanes};

}  // namespace cairn::codecs
