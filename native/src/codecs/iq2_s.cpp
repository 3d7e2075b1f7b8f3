// The 2-bit grid formats beside IQ2_XXS: a grid index picks 8 magnitudes (8, 25 or 43), one 4-bit scale
// per 16 weights: db = fl(fl(d * (0.5 + s)) * 0.25), w = fl(db * magnitude) * (+-1).
//   IQ2_XS: 256 weights per 74-byte block: f16 d, 32 little-endian u16 (a 9-bit grid index into
//           codec_tables::iq2xs_grid and a 7-bit sign index into IQ2_XXS's ksigns, per 8 weights),
//           8 bytes of sixteen 4-bit scales.
//   IQ2_S:  256 weights per 82-byte block: f16 d, 32 low bytes of 10-bit grid indexes
//           (codec_tables::iq2s_grid), 32 bytes of explicit sign bits, 8 bytes of their top 2 bits (four
//           to a byte), 8 bytes of scales.
#include "codec_impl.h"
#include "grid_lanes.h"
#include "iq2_xxs_grid.h"

namespace cairn::codecs {
namespace {

using namespace codec_tables;

inline float scale16(float d, const uint8_t* scales, int s) {
  return d * (0.5f + (float)((scales[s / 2] >> (4 * (s % 2))) & 0xF)) * 0.25f;
}

// 8 weights of grid point `point` (8 magnitudes), sign bit j of `signs` negating weight j
inline void octet(float db, const uint8_t* point, uint8_t signs, float* out) {
  for (int j = 0; j < 8; ++j) out[j] = db * (float)point[j] * ((signs >> j) & 1 ? -1.f : 1.f);
}

void xs_decode(const uint8_t* __restrict blk, float* __restrict out) {
  const float d = f16_at(blk);
  for (int k = 0; k < 32; ++k) {
    const uint16_t q = le16(blk + 2 + 2 * k);
    octet(scale16(d, blk + 66, k / 2), iq2xs_grid + 8 * (q & 511), iq2xxs_ksigns[q >> 9], out + 8 * k);
  }
}

void s_decode(const uint8_t* __restrict blk, float* __restrict out) {
  const float d = f16_at(blk);
  const uint8_t *qs = blk + 2, *signs = blk + 34, *qh = blk + 66, *scales = blk + 74;
  for (int k = 0; k < 32; ++k) {
    const int idx = qs[k] | (((qh[k / 4] >> (2 * (k % 4))) & 3) << 8);
    octet(scale16(d, scales, k / 2), iq2s_grid + 8 * idx, signs[k], out + 8 * k);
  }
}

// Lane forms (codec.h, decode_lanes): grid_lanes.h's octets.

void xs_decode_lanes(const uint8_t* __restrict b, float* __restrict out) {
  using namespace lanes;
  const f32x16 d = half_to_f32(load_le16(b));
  for (int k = 0; k < 32; ++k) {
    const u32x16 q = load_le16(b + 16 * (2 + 2 * k));
    store_octet(grid8(iq2xs_grid, q & 511u, ksign(q >> 9), iq2_db(d, b + 16 * 66, k / 2)), out + 16 * 8 * k);
  }
}

void s_decode_lanes(const uint8_t* __restrict b, float* __restrict out) {
  using namespace lanes;
  const f32x16 d = half_to_f32(load_le16(b));
  for (int k = 0; k < 32; ++k) {
    const u32x16 idx = load_u8(b + 16 * (2 + k)) | (((load_u8(b + 16 * (66 + k / 4)) >> (2 * (k % 4))) & 3u) << 8);
    const f32x16 db = iq2_db(d, b + 16 * 74, k / 2);
    store_octet(grid8(iq2s_grid, idx, load_u8(b + 16 * (34 + k)), db), out + 16 * 8 * k);
  }
}

}  // namespace

const BlockCodec IQ2_XS = block_codec<xs_decode, xs_decode_lanes, 256, 74>("IQ2_XS", 17);
const BlockCodec IQ2_S = block_codec<s_decode, s_decode_lanes, 256, 82>("IQ2_S", 22);

}  // namespace cairn::codecs
