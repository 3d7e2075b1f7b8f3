// Q6_K: 256 weights per 210-byte block: 128 bytes of low nibbles, 64 bytes of 2-bit high parts,
// 16 int8 scales, f16 d. Weight k = 128h + 32j + l (h < 2, j < 4, l < 32):
// low = nibble (j / 2) of ql[64h + 32(j % 2) + l], high = bits 2j..2j+1 of qh[32h + l];
// q = (low | high << 4) - 32, w = fl(fl(d * scale[k / 16]) * q).
#include "../formats/lanes.h"
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

// 16 rows at once (codec.h, decode_lanes): the same operations, one lane per row; the three code
// bytes behind four weights are loaded once.
void decode_lanes(const uint8_t* __restrict b, float* __restrict out) {
  using namespace lanes;
  const f32x16 d = half_to_f32(load_le16(b + 16 * 208));
  for (int h = 0; h < 2; ++h) {
    f32x16 D[8];
    for (int s = 0; s < 8; ++s) D[s] = d * to_f32(load_i8(b + 16 * (192 + 8 * h + s)));
    for (int l = 0; l < 32; ++l) {
      const u32x16 lo0 = load_u8(b + 16 * (64 * h + l)), lo1 = load_u8(b + 16 * (64 * h + 32 + l));
      const u32x16 hi = load_u8(b + 16 * (128 + 32 * h + l));
      const int t = l < 16 ? 0 : 1;
      for (int j = 0; j < 4; ++j) {
        const u32x16 lo = j & 1 ? lo1 : lo0;
        const u32x16 q = (((lo >> (4 * (j >> 1))) & 0xFu) | (((hi >> (2 * j)) & 3u) << 4)) - 32u;
        store(out + 16 * (128 * h + 32 * j + l), D[2 * j + t] * to_f32((i32x16)q));
      }
    }
  }
}

}  // namespace

const BlockCodec Q6_K{"Q6_K", 14, 256, 210, decode, decode_each<decode, 256, 210>, decode_lanes};

}  // namespace cairn::codecs
