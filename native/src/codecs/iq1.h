// The 1.5-bit grid formats: an 11-bit grid index picks 8 values of -1, 0, 1 (codec_tables::iq1s_grid),
// shifted by delta = +-1/8 and scaled: w = fl(dl * (value + delta)) (the sum is exact).
//   IQ1_S: 256 weights per 50-byte block: f16 d, 32 low bytes of the grid indexes, then per 32 weights
//          a little-endian u16 at 34 + 2s: four 3-bit index tops, a 3-bit scale s (bits 12-14),
//          delta's sign (bit 15); dl = fl(d * (2s + 1)).
//   IQ1_M: 256 weights per 56-byte block: 32 low index bytes, 16 bytes of nibbles at 32 (3 index top
//          bits and delta's sign per 8 weights), then four little-endian u16 at 48: sixteen 3-bit
//          scales (one per 16 weights) in their low 12 bits, the f16 d in their top nibbles;
//          dl = fl(d * (2s + 1)).
// In lanes a group is a scale's columns (32, or 16), a part 8 of them (grid_lanes.h, Iq1Octet).
#pragma once
#include "format.h"
#include "grid_lanes.h"

namespace cairn::kq {

inline void iq1_octet_scalar(float dl, int idx, bool negative_delta, float* out) {
  const float delta = negative_delta ? -0.125f : 0.125f;
  for (int j = 0; j < 8; ++j) out[j] = dl * ((float)codec_tables::iq1s_grid[8 * idx + j] + delta);
}

struct IQ1S {
  static constexpr const char* kName = "IQ1_S";
  static constexpr int kType = 19;
  static constexpr int kBlock = 256, kBytes = 50, kSub = 32, kGroup = 32, kParts = 4;

  static void decode(const uint8_t* __restrict blk, float* __restrict out) {
    using namespace codecs;
    const float d = f16_at(blk);
    const uint8_t* qs = blk + 2;
    for (int s = 0; s < 8; ++s) {
      const uint16_t qh = le16(blk + 34 + 2 * s);
      const float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
      for (int g = 0; g < 4; ++g)
        iq1_octet_scalar(dl, qs[4 * s + g] | (((qh >> (3 * g)) & 7) << 8), qh & 0x8000, out + 32 * s + 8 * g);
    }
  }

  static void scales(const uint8_t* b, f32x16* D, f32x16*) {
    const f32x16 d = lanes::half_to_f32(lanes::load_le16(b));
    for (int s = 0; s < 8; ++s)
      D[s] = d * lanes::to_f32(2u * ((lanes::load_le16(b + 16 * (34 + 2 * s)) >> 12) & 7u) + 1u);
  }
  struct Group {
    const uint8_t* q;  // the group's 4 low index bytes
    u32x16 qh;
    f32x16 dl;
    template <int P>
    codecs::Iq1Octet part() const {
      return codecs::iq1_octet(lanes::load_u8(q + 16 * P) | (((qh >> (3 * P)) & 7u) << 8), qh >> 15, dl);
    }
  };
  static Group group(const uint8_t* b, int r, const f32x16* D, const f32x16*) {
    const int s = r / 32;
    return {b + 16 * (2 + 4 * s), lanes::load_le16(b + 16 * (34 + 2 * s)), D[0]};
  }
};

struct IQ1M {
  static constexpr const char* kName = "IQ1_M";
  static constexpr int kType = 29;
  static constexpr int kBlock = 256, kBytes = 56, kSub = 16, kGroup = 16, kParts = 2;

  static void decode(const uint8_t* __restrict blk, float* __restrict out) {
    using namespace codecs;
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
      iq1_octet_scalar(dl, qs[k] | ((h & 7) << 8), h & 8, out + 8 * k);
    }
  }

  static void scales(const uint8_t* b, f32x16* D, f32x16*) {
    u32x16 sc[4];
    for (int i = 0; i < 4; ++i) sc[i] = lanes::load_le16(b + 16 * (48 + 2 * i));
    const f32x16 d = codecs::iq1m_d(sc);
    for (int s = 0; s < 16; ++s) D[s] = d * lanes::to_f32(2u * ((sc[s / 4] >> (3 * (s % 4))) & 7u) + 1u);
  }
  struct Group {
    const uint8_t* q;  // the group's 2 low index bytes
    u32x16 h;          // their nibbles: 3 index top bits and delta's sign each
    f32x16 dl;
    template <int P>
    codecs::Iq1Octet part() const {
      const u32x16 n = (h >> (4 * P)) & 0xFu;
      return codecs::iq1_octet(lanes::load_u8(q + 16 * P) | ((n & 7u) << 8), n >> 3, dl);
    }
  };
  static Group group(const uint8_t* b, int r, const f32x16* D, const f32x16*) {
    const int g = r / 16;
    return {b + 16 * 2 * g, lanes::load_u8(b + 16 * (32 + g)), D[0]};
  }
};

}  // namespace cairn::kq
