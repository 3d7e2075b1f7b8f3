// The 3-bit grid formats: a grid index picks 4 magnitudes, signs come per 8 weights, one scale per 32.
//   IQ3_XXS: 256 weights per 98-byte block: f16 d, 64 grid indexes (codec_tables::iq3xxs_grid), then
//            per 32 weights a little-endian u32 at 66 + 4s: four 7-bit sign indexes (IQ2_XXS's ksigns
//            table) and a 4-bit scale s on top; db = fl(fl(d * (0.5 + s)) * 0.5).
//   IQ3_S:   256 weights per 110-byte block: f16 d, 64 low bytes of 9-bit grid indexes
//            (codec_tables::iq3s_grid), 8 bytes of their ninth bits at 66, 32 bytes of explicit sign
//            bits (one per weight) at 74, 4 bytes of eight 4-bit scales at 106; db = fl(d * (1 + 2s)).
// w = fl(db * magnitude) * (+-1), in gguf.quants' order (the sign's product is an exact negation).
// In lanes a group is a scale's 32 columns, a part 8 of them, whose two grid points part<P>() gathers
// (grid_lanes.h) when the part starts; D holds each group's db.
#pragma once
#include "format.h"
#include "grid_lanes.h"
#include "iq2_xxs_grid.h"

namespace cairn::kq {

inline float iq3_signed_product(float db, uint8_t magnitude, bool negative) {
  return db * (float)magnitude * (negative ? -1.f : 1.f);
}

struct IQ3XXS {
  static constexpr const char* kName = "IQ3_XXS";
  static constexpr int kType = 18;
  static constexpr int kBlock = 256, kBytes = 98, kSub = 32, kGroup = 32, kParts = 4;

  static void decode(const uint8_t* __restrict blk, float* __restrict out) {
    using namespace codecs;
    using namespace codec_tables;
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
        for (int j = 0; j < 8; ++j) o[j] = iq3_signed_product(db, j < 4 ? a[j] : b[j - 4], (signs >> j) & 1);
      }
    }
  }

  static void scales(const uint8_t* b, f32x16* D, f32x16*) {
    const f32x16 d = lanes::half_to_f32(lanes::load_le16(b));
    for (int s = 0; s < 8; ++s) D[s] = d * (0.5f + lanes::to_f32(lanes::load_le32(b + 16 * (66 + 4 * s)) >> 28)) * 0.5f;
  }
  struct Group {
    const uint8_t* q;  // the group's 8 grid indexes
    u32x16 aux;
    f32x16 db;
    template <int P>
    codecs::GridOctet part() const {
      const u32x16 a = lanes::load_u8(q + 16 * 2 * P), c = lanes::load_u8(q + 16 * (2 * P + 1));
      return codecs::grid4x2(codec_tables::iq3xxs_grid, a, c, codecs::ksign((aux >> (7 * P)) & 0x7Fu), db);
    }
  };
  static Group group(const uint8_t* b, int r, const f32x16* D, const f32x16*) {
    const int s = r / 32;
    return {b + 16 * (2 + 8 * s), lanes::load_le32(b + 16 * (66 + 4 * s)), D[0]};
  }
};

struct IQ3S {
  static constexpr const char* kName = "IQ3_S";
  static constexpr int kType = 21;
  static constexpr int kBlock = 256, kBytes = 110, kSub = 32, kGroup = 32, kParts = 4;

  static void decode(const uint8_t* __restrict blk, float* __restrict out) {
    using namespace codecs;
    const float d = f16_at(blk);
    const uint8_t *qs = blk + 2, *qh = blk + 66, *signs = blk + 74, *scales = blk + 106;
    for (int t = 0; t < 256; ++t) {
      const int s = t / 32, k = t / 4;
      const float db = d * (float)(1 + 2 * ((scales[s / 2] >> (4 * (s % 2))) & 0xF));
      const int idx = qs[k] | (((qh[k / 8] >> (k % 8)) & 1) << 8);
      out[t] = iq3_signed_product(db, codec_tables::iq3s_grid[4 * idx + t % 4], (signs[t / 8] >> (t % 8)) & 1);
    }
  }

  static void scales(const uint8_t* b, f32x16* D, f32x16*) {
    const f32x16 d = lanes::half_to_f32(lanes::load_le16(b));
    for (int s = 0; s < 8; ++s)
      D[s] = d * lanes::to_f32(1u + 2u * ((lanes::load_u8(b + 16 * (106 + s / 2)) >> (4 * (s % 2))) & 0xFu));
  }
  struct Group {
    const uint8_t *q, *signs;  // the group's 8 low index bytes and 4 sign bytes
    u32x16 qh;                 // their ninth bits
    f32x16 db;
    template <int P>
    codecs::GridOctet part() const {
      const u32x16 a = lanes::load_u8(q + 16 * 2 * P) | (((qh >> (2 * P)) & 1u) << 8);
      const u32x16 c = lanes::load_u8(q + 16 * (2 * P + 1)) | (((qh >> (2 * P + 1)) & 1u) << 8);
      return codecs::grid4x2(codec_tables::iq3s_grid, a, c, lanes::load_u8(signs + 16 * P), db);
    }
  };
  static Group group(const uint8_t* b, int r, const f32x16* D, const f32x16*) {
    const int s = r / 32;
    return {b + 16 * (2 + 8 * s), b + 16 * (74 + 4 * s), lanes::load_u8(b + 16 * (66 + s)), D[0]};
  }
};

}  // namespace cairn::kq
