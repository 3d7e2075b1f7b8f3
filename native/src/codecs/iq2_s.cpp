// The 2-bit grid formats beside IQ2_XXS: a grid index picks 8 magnitudes (8, 25 or 43), one 4-bit scale
// per 16 weights: db = fl(fl(d * (0.5 + s)) * 0.25), w = fl(db * magnitude) * (+-1).
//   IQ2_XS: 256 weights per 74-byte block: f16 d, 32 little-endian u16 (a 9-bit grid index into
//           codec_tables::iq2xs_grid and a 7-bit sign index into IQ2_XXS's ksigns, per 8 weights),
//           8 bytes of sixteen 4-bit scales.
//   IQ2_S:  256 weights per 82-byte block: f16 d, 32 low bytes of 10-bit grid indexes
//           (codec_tables::iq2s_grid), 32 bytes of explicit sign bits, 8 bytes of their top 2 bits (four
//           to a byte), 8 bytes of scales.
#include "codec_impl.h"
#include "tables.h"

namespace cairn::codecs {
namespace {

using namespace codec_tables;

inline float scale16(float d, const uint8_t* scales, int s) {
  return d * (0.5f + (float)((scales[s / 2] >> (4 * (s % 2))) & 0xF)) * 0.25f;
}

// 8 weights of grid point `point` (8 magnitudes), sign bit j of `signs` negating weight j
inline void octet(float db, const uint8_t* point, uint8_t signs, float* out) {
  for (int j = 0; j < 8; ++j) {
    const float w = db * (float)point[j];
    out[j] = (signs >> j) & 1 ? -w : w;
  }
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

}  // namespace

const BlockCodec IQ2_XS{"IQ2_XS", 17, 256, 74, xs_decode, decode_each<xs_decode, 256, 74>,
                        decode_lanes_each<xs_decode, 256, 74>};
const BlockCodec IQ2_S{"IQ2_S", 22, 256, 82, s_decode, decode_each<s_decode, 256, 82>,
                       decode_lanes_each<s_decode, 256, 82>};

}  // namespace cairn::codecs
