// The grid types' 8 columns of 16 rows (IQ1_S, IQ1_M, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S), the part objects
// of their definitions (codecs/iq1.h, iq2_s.h, iq3.h): each lane's grid point gathered as two words of
// 4 byte values (lanes::gather_words), then per column one value.
#pragma once
#include "../formats/lanes.h"
#include "tables.h"

namespace cairn::codecs {

// Grid magnitudes with signs: w = fl(fl(db * magnitude) * (+-1)), gguf.quants' order. words: the two
// words of 4 magnitudes (one 8-value point, or two 4-value points); neg: bit m set where column m is
// negative. at<P> takes the part index the part interface (format.h) passes and ignores it.
struct GridOctet {
  lanes::u32x16 w0, w1, neg;
  lanes::f32x16 db;
  template <int P = 0>
  lanes::f32x16 at(int m) const {
    const lanes::u32x16 w = m < 4 ? w0 : w1;
    const lanes::f32x16 sign = lanes::bits(0x3f800000u | (((neg >> m) & 1u) << 31));
    return db * lanes::to_f32((w >> (8 * (m % 4))) & 0xFFu) * sign;
  }
};
// One 8-value point of a grid of 8-byte points (IQ2_XS, IQ2_S).
inline GridOctet grid8(const uint8_t* grid, lanes::u32x16 idx, lanes::u32x16 neg, lanes::f32x16 db) {
  return {lanes::gather_words(grid, 2u * idx), lanes::gather_words(grid, 2u * idx + 1u), neg, db};
}
// Two 4-value points of a grid of 4-byte points (IQ3_XXS, IQ3_S).
inline GridOctet grid4x2(const uint8_t* grid, lanes::u32x16 a, lanes::u32x16 b, lanes::u32x16 neg, lanes::f32x16 db) {
  return {lanes::gather_words(grid, a), lanes::gather_words(grid, b), neg, db};
}

// IQ1: w = fl(dl * (value + delta)), value in -1, 0, 1 (int8 in the grid), delta +-1/8 (the sum exact).
// delta_neg: 1 in lanes whose delta is negative.
struct Iq1Octet {
  lanes::u32x16 w0, w1;
  lanes::f32x16 dl, delta;
  template <int P = 0>
  lanes::f32x16 at(int m) const {
    const lanes::u32x16 w = m < 4 ? w0 : w1;
    const lanes::i32x16 v = (lanes::i32x16)(w << (24 - 8 * (m % 4))) >> 24;  // the int8, sign-extended
    return dl * (lanes::to_f32(v) + delta);
  }
};
inline Iq1Octet iq1_octet(lanes::u32x16 idx, lanes::u32x16 delta_neg, lanes::f32x16 dl) {
  const uint8_t* grid = reinterpret_cast<const uint8_t*>(codec_tables::iq1s_grid);
  return {lanes::gather_words(grid, 2u * idx), lanes::gather_words(grid, 2u * idx + 1u), dl,
          lanes::bits(0x3e000000u | (delta_neg << 31))};  // +-0.125f
}

// IQ2_XS / IQ2_S: the db of 16-column group s from the 16 lanes' scale bytes at scales16 (lane_byte),
// fl(fl(d * (0.5 + scale)) * 0.25).
inline lanes::f32x16 iq2_db(lanes::f32x16 d, const uint8_t* scales16, int s) {
  const lanes::u32x16 sc = (lanes::load_u8(scales16 + 16 * (s / 2)) >> (4 * (s % 2))) & 0xFu;
  return d * (0.5f + lanes::to_f32(sc)) * 0.25f;
}
// IQ1_M: the f16 d held in the top nibbles of the four scale words sc[0..3].
inline lanes::f32x16 iq1m_d(const lanes::u32x16* sc) {
  return lanes::half_to_f32(((sc[0] & 0xF000u) >> 12) | ((sc[1] & 0xF000u) >> 8) | ((sc[2] & 0xF000u) >> 4) |
                            (sc[3] & 0xF000u));
}

}  // namespace cairn::codecs
