// Q2_K: 256 weights per 84-byte block: 16 bytes of 4-bit (scale, min) pairs (scale low nibble),
// 64 bytes of 2-bit codes, f16 d, f16 dmin. Weight k = 128h + 32j + l: q = bits 2j..2j+1 of
// qs[32h + l]; sub-block k / 16: D = fl(d * scale), M = fl(dmin * min), w = fl(fl(D * q) - M).
#include "../formats/lanes.h"
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

// 16 rows at once (codec.h, decode_lanes): the same operations, one lane per row; each code byte
// is loaded once for its four weights.
void decode_lanes(const uint8_t* __restrict b, float* __restrict out) {
  using namespace lanes;
  const f32x16 d = half_to_f32(load_le16(b + 16 * 80)), dmin = half_to_f32(load_le16(b + 16 * 82));
  for (int h = 0; h < 2; ++h) {
    f32x16 D[8], M[8];
    for (int s = 0; s < 8; ++s) {
      const u32x16 sc = load_u8(b + 16 * (8 * h + s));
      D[s] = d * to_f32(sc & 0xFu);
      M[s] = dmin * to_f32(sc >> 4);
    }
    for (int l = 0; l < 32; ++l) {
      const u32x16 q = load_u8(b + 16 * (16 + 32 * h + l));
      const int t = l < 16 ? 0 : 1;
      for (int j = 0; j < 4; ++j)
        store(out + 16 * (128 * h + 32 * j + l), D[2 * j + t] * to_f32((q >> (2 * j)) & 3u) - M[2 * j + t]);
    }
  }
}

}  // namespace

const BlockCodec Q2_K{"Q2_K", 10, 256, 84, decode, decode_each<decode, 256, 84>, decode_lanes};

}  // namespace cairn::codecs
