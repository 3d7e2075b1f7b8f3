// The 1.5-bit grid formats: an 11-bit grid index picks 8 values of -1, 0, 1 (codec_tables::iq1s_grid),
// shifted by delta = +-1/8 and scaled: w = fl(dl * (value + delta)) (the sum is exact).
//   IQ1_S: 256 weights per 50-byte block: f16 d, 32 low bytes of the grid indexes, then per 32 weights
//          a little-endian u16: four 3-bit index tops, a 3-bit scale s (bits 12-14), delta's sign (bit
//          15); dl = fl(d * (2s + 1)).
//   IQ1_M: 256 weights per 56-byte block: 32 low index bytes, 16 bytes of nibbles (3 index top bits and
//          delta's sign per 8 weights), then four little-endian u16: sixteen 3-bit scales (one per 16
//          weights) in their low 12 bits, the f16 d in their top nibbles; dl = fl(d * (2s + 1)).
#include "codec_impl.h"
#include "grid_lanes.h"

namespace cairn::codecs {
namespace {

using codec_tables::iq1s_grid;

constexpr float kDelta = 0.125f;

inline void octet(float dl, int idx, bool negative_delta, float* out) {
  const float delta = negative_delta ? -kDelta : kDelta;
  for (int j = 0; j < 8; ++j) out[j] = dl * ((float)iq1s_grid[8 * idx + j] + delta);
}

void s_decode(const uint8_t* __restrict blk, float* __restrict out) {
  const float d = f16_at(blk);
  const uint8_t* qs = blk + 2;
  for (int s = 0; s < 8; ++s) {
    const uint16_t qh = le16(blk + 34 + 2 * s);
    const float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
    for (int g = 0; g < 4; ++g)
      octet(dl, qs[4 * s + g] | (((qh >> (3 * g)) & 7) << 8), qh & 0x8000, out + 32 * s + 8 * g);
  }
}

void m_decode(const uint8_t* __restrict blk, float* __restrict out) {
  const uint8_t *qs = blk, *qh = blk + 32;
  uint16_t sc[4];
  for (int i = 0; i < 4; ++i) sc[i] = le16(blk + 48 + 2 * i);
  const uint16_t dbits = (uint16_t)(((sc[0] & 0xF000) >> 12) | ((sc[1] & 0xF000) >> 8) | ((sc[2] & 0xF000) >> 4) |
                                    (sc[3] & 0xF000));
  const float d = f16_to_f32(dbits);
  for (int k = 0; k < 32; ++k) {
    const int h = (qh[k / 2] >> (4 * (k % 2))) & 0xF;
    const int s = k / 2;  // 16 weights per scale
    const float dl = d * (float)(2 * ((sc[s / 4] >> (3 * (s % 4))) & 7) + 1);
    octet(dl, qs[k] | ((h & 7) << 8), h & 8, out + 8 * k);
  }
}

// Lane forms (codec.h, decode_lanes): grid_lanes.h's octets.
void s_decode_lanes(const uint8_t* __restrict b, float* __restrict out) {
  using namespace lanes;
  const f32x16 d = half_to_f32(load_le16(b));
  for (int s = 0; s < 8; ++s) {
    const u32x16 qh = load_le16(b + 16 * (34 + 2 * s));
    const f32x16 dl = d * to_f32(2u * ((qh >> 12) & 7u) + 1u);
    for (int g = 0; g < 4; ++g)
      store_octet(iq1_octet(load_u8(b + 16 * (2 + 4 * s + g)) | (((qh >> (3 * g)) & 7u) << 8), qh >> 15, dl),
                  out + 16 * (32 * s + 8 * g));
  }
}

void m_decode_lanes(const uint8_t* __restrict b, float* __restrict out) {
  using namespace lanes;
  u32x16 sc[4];
  for (int i = 0; i < 4; ++i) sc[i] = load_le16(b + 16 * (48 + 2 * i));
  const f32x16 d = iq1m_d(sc);
  for (int k = 0; k < 32; ++k) {
    const u32x16 h = (load_u8(b + 16 * (32 + k / 2)) >> (4 * (k % 2))) & 0xFu;
    const int s = k / 2;
    const f32x16 dl = d * to_f32(2u * ((sc[s / 4] >> (3 * (s % 4))) & 7u) + 1u);
    store_octet(iq1_octet(load_u8(b + 16 * k) | ((h & 7u) << 8), h >> 3, dl), out + 16 * 8 * k);
  }
}

}  // namespace

const BlockCodec IQ1_S = block_codec<s_decode, s_decode_lanes, 256, 50>("IQ1_S", 19);
const BlockCodec IQ1_M = block_codec<m_decode, m_decode_lanes, 256, 56>("IQ1_M", 29);

}  // namespace cairn::codecs
