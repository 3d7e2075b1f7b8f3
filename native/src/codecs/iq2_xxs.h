// IQ2_XXS: 256 weights per 66-byte block: f16 d, then 8 groups of 32 weights in 8 bytes each:
// 4 grid indices (one byte per 8 weights; codec_tables::iq2xxs_grid gives their magnitudes), then a
// little-endian u32 of four 7-bit sign indices (codec_tables::iq2xxs_ksigns) and a 4-bit scale s.
// db = fl(fl(d * (0.5 + s)) * 0.25), w = fl(db * grid) * (+-1), in gguf.quants' order.
//
// In lanes a group of 32 columns is four grid points of 8 columns (part i: the packed grid's 2-bit
// magnitude codes, iq2_xxs_grid.h, looked up once per group) and their signs. Each part's signs are
// made when the part starts (part()): all four parts' codes and signs of 4 panels at once were 36
// vectors, which spilled.
#pragma once
#include "format.h"
#include "iq2_xxs_grid.h"

namespace cairn::kq {

struct IQ2XXS {
  static constexpr const char* kName = "IQ2_XXS";
  static constexpr int kType = 16;
  static constexpr int kBlock = 256, kBytes = 66, kSub = 32, kGroup = 32, kParts = 4;

  static void decode(const uint8_t* __restrict blk, float* __restrict out) {
    using namespace codecs;
    const float d = f16_at(blk);
    for (int g = 0; g < 8; ++g) {
      const uint8_t* p = blk + 2 + 8 * g;
      const uint32_t aux1 = le32(p + 4);
      const float db = d * (0.5f + (float)(aux1 >> 28)) * 0.25f;
      // The group's 32 magnitudes and 32 sign bits first, then one 32-wide loop.
      uint8_t mag[32];
      uint32_t neg = 0;
      for (int i = 0; i < 4; ++i) {
        std::memcpy(mag + 8 * i, codec_tables::iq2xxs_grid + 8 * p[i], 8);
        neg |= (uint32_t)codec_tables::iq2xxs_ksigns[(aux1 >> (7 * i)) & 0x7F] << (8 * i);
      }
      float* o = out + 32 * g;
      for (int l = 0; l < 32; ++l) o[l] = db * (float)mag[l] * (((neg >> l) & 1) ? -1.0f : 1.0f);
    }
  }

  static void scales(const uint8_t* b, f32x16* D, f32x16*) {
    const f32x16 d = lanes::half_to_f32(lanes::load_le16(b));
    for (int g = 0; g < 8; ++g) D[g] = d * (0.5f + lanes::to_f32(lanes::load_le32(b + 16 * (2 + 8 * g + 4)) >> 28)) * 0.25f;
  }
  struct Part {
    u32x16 code, neg;
    f32x16 db;
    template <int P>
    f32x16 at(int m) const {
      const u32x16 c = code >> (2 * m);
      f32x16 mag;
      if constexpr (lanes::kLookup8Permutes) {  // the permute reads c's low 3 or 4 bits: the next code is ignored
        const f32x16 t = {8, 25, 43, 0, 8, 25, 43, 0, 8, 25, 43, 0, 8, 25, 43, 0};
        mag = lanes::lookup8(t, c);
      } else {
        const u32x16 c3 = c & 3u;
        mag = lanes::to_f32((c3 << 4) + c3 + (c3 >> 1) + 8u);
      }
      // fl(fl(db * mag) * -1) = fl(db * -mag): negation is exact and rounding is symmetric, so the
      // sign goes onto the magnitude's bits and one product is left.
      return db * lanes::bits(lanes::bits(mag) ^ ((neg << (31 - m)) & 0x80000000u));
    }
  };
  struct Group {
    u32x16 code[4], aux1;
    f32x16 db;
    template <int P>
    Part part() const { return {code[P], codecs::ksign((aux1 >> (7 * P)) & 0x7Fu), db}; }
  };
  static Group group(const uint8_t* b, int r, const f32x16* D, const f32x16*) {
    const uint8_t* p = b + 16 * (2 + 8 * (r / 32));  // the four parts' grid indexes: 64 bytes
    Group g;
#if defined(__AVX512BW__)
    lanes::lookup256_u16(codecs::kGrid2Words.code, p, g.code[0], g.code[1]);
    lanes::lookup256_u16(codecs::kGrid2Words.code, p + 32, g.code[2], g.code[3]);
#else
    for (int i = 0; i < 4; ++i) g.code[i] = lanes::gather_u32(codecs::kGrid2.code, lanes::load_u8(p + 16 * i));
#endif
    g.aux1 = lanes::load_le32(p + 16 * 4);
    g.db = D[0];
    return g;
  }
};

}  // namespace cairn::kq
