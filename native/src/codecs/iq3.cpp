// The 3-bit grid formats: a grid index picks 4 magnitudes, signs come per 8 weights, one scale per 32.
//   IQ3_XXS: 256 weights per 98-byte block: f16 d, 64 grid indexes (codec_tables::iq3xxs_grid), then
//            per 32 weights a little-endian u32: four 7-bit sign indexes (IQ2_XXS's ksigns table) and a
//            4-bit scale s on top; db = fl(fl(d * (0.5 + s)) * 0.5).
//   IQ3_S:   256 weights per 110-byte block: f16 d, 64 low bytes of 9-bit grid indexes
//            (codec_tables::iq3s_grid), 8 bytes of their ninth bits, 32 bytes of explicit sign bits (one
//            per weight), 4 bytes of eight 4-bit scales; db = fl(d * (1 + 2s)).
// w = fl(db * magnitude) * (+-1), in gguf.quants' order (the sign's product is an exact negation).
#include "codec_impl.h"
#include "grid_lanes.h"
#include "iq2_xxs_grid.h"

namespace cairn::codecs {
namespace {

using namespace codec_tables;

inline float signed_product(float db, uint8_t magnitude, bool negative) {
  return db * (float)magnitude * (negative ? -1.f : 1.f);
}

void xxs_decode(const uint8_t* __restrict blk, float* __restrict out) {
  const float d = f16_at(blk);
  const uint8_t* qs = blk + 2;
  for (int s = 0; s < 8; ++s) {
    const uint32_t aux = le32(blk + 2 + 64 + 4 * s);
    const float db = d * (0.5f + (float)(aux >> 28)) * 0.5f;
    for (int g = 0; g < 4; ++g) {
      const uint8_t signs = iq2xxs_ksigns[(aux >> (7 * g)) & 0x7F];
      const uint8_t* a = iq3xxs_grid + 4 * qs[8 * s + 2 * g];
      const uint8_t* b = iq3xxs_grid + 4 * qs[8 * s + 2 * g + 1];
      float* o = out + 32 * s + 8 * g;
      for (int j = 0; j < 8; ++j) o[j] = signed_product(db, j < 4 ? a[j] : b[j - 4], (signs >> j) & 1);
    }
  }
}

void s_decode(const uint8_t* __restrict blk, float* __restrict out) {
  const float d = f16_at(blk);
  const uint8_t *qs = blk + 2, *qh = blk + 66, *signs = blk + 74, *scales = blk + 106;
  for (int t = 0; t < 256; ++t) {
    const int s = t / 32, k = t / 4;
    const float db = d * (float)(1 + 2 * ((scales[s / 2] >> (4 * (s % 2))) & 0xF));
    const int idx = qs[k] | (((qh[k / 8] >> (k % 8)) & 1) << 8);
    out[t] = signed_product(db, iq3s_grid[4 * idx + t % 4], (signs[t / 8] >> (t % 8)) & 1);
  }
}

// Lane forms (codec.h, decode_lanes): grid_lanes.h's octets.
void xxs_decode_lanes(const uint8_t* __restrict b, float* __restrict out) {
  using namespace lanes;
  const f32x16 d = half_to_f32(load_le16(b));
  for (int s = 0; s < 8; ++s) {
    const u32x16 aux = load_le32(b + 16 * (66 + 4 * s));
    const f32x16 db = d * (0.5f + to_f32(aux >> 28)) * 0.5f;
    for (int g = 0; g < 4; ++g) {
      const u32x16 neg = ksign((aux >> (7 * g)) & 0x7Fu);
      const uint8_t* q = b + 16 * (2 + 8 * s + 2 * g);
      store_octet(grid4x2(iq3xxs_grid, load_u8(q), load_u8(q + 16), neg, db), out + 16 * (32 * s + 8 * g));
    }
  }
}

void s_decode_lanes(const uint8_t* __restrict b, float* __restrict out) {
  using namespace lanes;
  const f32x16 d = half_to_f32(load_le16(b));
  for (int s = 0; s < 8; ++s) {
    const u32x16 sc = (load_u8(b + 16 * (106 + s / 2)) >> (4 * (s % 2))) & 0xFu;
    const f32x16 db = d * to_f32(1u + 2u * sc);
    const u32x16 qh = load_u8(b + 16 * (66 + s));  // the ninth bits of grid indexes 8s .. 8s + 7
    for (int g = 0; g < 4; ++g) {  // 8 weights: grid indexes 8s + 2g, + 1 and sign byte 4s + g
      const u32x16 a = load_u8(b + 16 * (2 + 8 * s + 2 * g)) | (((qh >> (2 * g)) & 1u) << 8);
      const u32x16 c = load_u8(b + 16 * (3 + 8 * s + 2 * g)) | (((qh >> (2 * g + 1)) & 1u) << 8);
      store_octet(grid4x2(iq3s_grid, a, c, load_u8(b + 16 * (74 + 4 * s + g)), db), out + 16 * (32 * s + 8 * g));
    }
  }
}

}  // namespace

const BlockCodec IQ3_XXS = block_codec<xxs_decode, xxs_decode_lanes, 256, 98>("IQ3_XXS", 18);
const BlockCodec IQ3_S = block_codec<s_decode, s_decode_lanes, 256, 110>("IQ3_S", 21);

}  // namespace cairn::codecs
