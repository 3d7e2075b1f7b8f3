// The 2-bit grid formats beside IQ2_XXS: a grid index picks 8 magnitudes (8, 25 or 43), one 4-bit scale
// per 16 weights: db = fl(fl(d * (0.5 + s)) * 0.25), w = fl(db * magnitude) * (+-1).
//   IQ2_XS: 256 weights per 74-byte block: f16 d, 32 little-endian u16 (a 9-bit grid index into
//           codec_tables::iq2xs_grid and a 7-bit sign index into IQ2_XXS's ksigns, per 8 weights),
//           8 bytes of sixteen 4-bit scales at 66.
//   IQ2_S:  256 weights per 82-byte block: f16 d, 32 low bytes of 10-bit grid indexes
//           (codec_tables::iq2s_grid), 32 bytes of explicit sign bits at 34, 8 bytes of their top 2
//           bits (four to a byte) at 66, 8 bytes of scales at 74.
// In lanes a group is a scale's 16 columns, a part 8 of them (one grid point, grid_lanes.h).
#pragma once
#include "format.h"
#include "grid_lanes.h"
#include "iq2_xxs_grid.h"

namespace cairn::kq {

inline float iq2_scale16(float d, const uint8_t* scales, int s) {
  return d * (0.5f + (float)((scales[s / 2] >> (4 * (s % 2))) & 0xF)) * 0.25f;
}
// 8 weights of grid point `point` (8 magnitudes), sign bit j of `signs` negating weight j
inline void iq2_octet(float db, const uint8_t* point, uint8_t signs, float* out) {
  for (int j = 0; j < 8; ++j) out[j] = db * (float)point[j] * ((signs >> j) & 1 ? -1.f : 1.f);
}
// One 4-bit scale per 16 columns, lane-wise.
inline void iq2_scales16(const uint8_t* b, const uint8_t* scales, f32x16* D) {
  const f32x16 d = lanes::half_to_f32(lanes::load_le16(b));
  for (int s = 0; s < 16; ++s) D[s] = codecs::iq2_db(d, scales, s);
}

struct IQ2XS {
  static constexpr const char* kName = "IQ2_XS";
  static constexpr int kType = 17;
  static constexpr int kBlock = 256, kBytes = 74, kSub = 16, kGroup = 16, kParts = 2;

  static void decode(const uint8_t* __restrict blk, float* __restrict out) {
    using namespace codecs;
    const float d = f16_at(blk);
    for (int k = 0; k < 32; ++k) {
      const uint16_t q = le16(blk + 2 + 2 * k);
      iq2_octet(iq2_scale16(d, blk + 66, k / 2), codec_tables::iq2xs_grid + 8 * (q & 511),
                codec_tables::iq2xxs_ksigns[q >> 9], out + 8 * k);
    }
  }

  static void scales(const uint8_t* b, f32x16* D, f32x16*) { iq2_scales16(b, b + 16 * 66, D); }
  struct Group {
    const uint8_t* q;  // the group's two u16
    f32x16 db;
    template <int P>
    codecs::GridOctet part() const {
      const u32x16 v = lanes::load_le16(q + 16 * 2 * P);
      return codecs::grid8(codec_tables::iq2xs_grid, v & 511u, codecs::ksign(v >> 9), db);
    }
  };
  static Group group(const uint8_t* b, int r, const f32x16* D, const f32x16*) {
    return {b + 16 * (2 + 4 * (r / 16)), D[0]};
  }
};

struct IQ2S {
  static constexpr const char* kName = "IQ2_S";
  static constexpr int kType = 22;
  static constexpr int kBlock = 256, kBytes = 82, kSub = 16, kGroup = 16, kParts = 2;

  static void decode(const uint8_t* __restrict blk, float* __restrict out) {
    using namespace codecs;
    const float d = f16_at(blk);
    const uint8_t *qs = blk + 2, *signs = blk + 34, *qh = blk + 66, *scales = blk + 74;
    for (int k = 0; k < 32; ++k) {
      const int idx = qs[k] | (((qh[k / 4] >> (2 * (k % 4))) & 3) << 8);
      iq2_octet(iq2_scale16(d, scales, k / 2), codec_tables::iq2s_grid + 8 * idx, signs[k], out + 8 * k);
    }
  }

  static void scales(const uint8_t* b, f32x16* D, f32x16*) { iq2_scales16(b, b + 16 * 74, D); }
  struct Group {
    const uint8_t* b;
    int k;  // the group's first 8-column index (2 a group)
    f32x16 db;
    template <int P>
    codecs::GridOctet part() const {
      const int i = k + P;
      const u32x16 top = (lanes::load_u8(b + 16 * (66 + i / 4)) >> (2 * (i % 4))) & 3u;
      const u32x16 idx = lanes::load_u8(b + 16 * (2 + i)) | (top << 8);
      return codecs::grid8(codec_tables::iq2s_grid, idx, lanes::load_u8(b + 16 * (34 + i)), db);
    }
  };
  static Group group(const uint8_t* b, int r, const f32x16* D, const f32x16*) { return {b, 2 * (r / 16), D[0]}; }
};

}  // namespace cairn::kq
