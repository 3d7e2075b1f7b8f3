// MXFP4's numbers, shared by its definition (mxfp4.h) and the FP4 experts' widening (formats/widen.h):
// the e8m0 scale and the e2m1 code values, scalar and 16 lanes.
// The scale is half of 2^(e - 127), as ggml_e8m0_to_fp32_half builds it (subnormal for e < 2), and
// the code values are doubled: w = fl(scale * kvalue).
#pragma once
#include <utility>

#include "../formats/lanes.h"
#include "codec_impl.h"
#include "tables.h"

// kvalue_bits() returns a 64-byte vector from inlined code; the warning that such a return differs
// in ABI without AVX-512 (the v2, v3 and aarch64 builds) is moot.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace cairn::codecs::mxfp4 {

inline float e8m0_half(uint8_t e) {
  return bits_f32(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
}
// The same, lane-wise: e < 2 is (e + 1) << 21 (0x00200000 << e); masks, not a compare (lanes.h,
// half_to_f32).
inline lanes::f32x16 e8m0_half_lanes(lanes::u32x16 e) {
  const lanes::u32x16 e1 = e >> 1, low = ((e1 | (0u - e1)) >> 31) - 1u;  // all ones where e < 2
  return lanes::bits((((e + 1u) << 21) & low) | (((e - 1u) << 23) & ~low));
}

// The float bits of the doubled e2m1 value of a 4-bit code (s e e m): exponent field e > 0 is
// 2^e * (1 + m/2), e == 0 is m (0 or 1); code 8 is +0, as the table's integer 0 converts. Masks
// only (no table lookup, no variable shift, no branch), written once for a scalar or a vector U.
template <class U>
constexpr U kvalue_bits(const U& c) {
  const U e = (c >> 1) & 3, m = c & 1;
  const U normal = ((e + 127) << 23) | (m << 22);
  const U is_sub = ((e | (0 - e)) >> 31) - 1;          // all ones where e == 0
  const U mag = (normal & ~is_sub) | ((0 - m) & (127u << 23) & is_sub);
  const U nonzero = 0 - ((mag | (0 - mag)) >> 31);      // all ones where mag != 0
  return mag | (((c & 8) << 28) & nonzero);
}
// kvalue_bits() read back as an integer, to hold it to the format's table (generated from gguf).
constexpr int kvalue_of_bits(uint32_t b) {
  if ((b & 0x7fffffffu) == 0) return (b >> 31) ? -1000 : 0;   // -0 would differ from the table's 0
  const int v = (int)(((b & 0x7fffffu) | 0x800000u) >> (23 - (int)(((b >> 23) & 255) - 127)));
  return (b >> 31) ? -v : v;
}
constexpr bool kvalues_match() {
  for (uint32_t c = 0; c < 16; ++c)
    if (kvalue_of_bits(kvalue_bits(c)) != codec_tables::mxfp4_kvalues[c]) return false;
  return true;
}
static_assert(kvalues_match(), "MXFP4: kvalue_bits() disagrees with codec_tables::mxfp4_kvalues");

template <size_t... C>
constexpr lanes::f32x16 kvalue_table(std::index_sequence<C...>) {
  return lanes::f32x16{(float)codec_tables::mxfp4_kvalues[C]...};
}
template <size_t... C>
constexpr lanes::u8x16 kvalue_byte_table(std::index_sequence<C...>) {
  return lanes::u8x16{(uint8_t)codec_tables::mxfp4_kvalues[C]...};
}
// The doubled e2m1 values of the low 4 bits of 16 code bytes: a byte shuffle and a widening (lanes.h,
// lookup_i8), for ISAs where kvalue_lanes() below would be the masks.
inline lanes::f32x16 kvalue_bytes(lanes::u8x16 c) {
  constexpr lanes::u8x16 table = kvalue_byte_table(std::make_index_sequence<16>());
  return lanes::lookup_i8(table, c);
}
// The doubled e2m1 values of the low 4 bits of each lane (higher bits ignored): one permute from a
// register table where the ISA has it (kvalues_match: the same bits as kvalue_bits), else the masks.
inline lanes::f32x16 kvalue_lanes(lanes::u32x16 c) {
  if constexpr (lanes::kLookupPermutes) {
    constexpr lanes::f32x16 table = kvalue_table(std::make_index_sequence<16>());
    return lanes::lookup(table, c);
  } else {
    return lanes::bits(kvalue_bits(c & 0xFu));
  }
}
inline constexpr lanes::u8x16 kKvalueBytes = kvalue_byte_table(std::make_index_sequence<16>());
// The doubled e2m1 values of bits S..S+3 of 16 lanes' code words at p (codec.h, lane_byte): the
// permute above on AVX-512, a byte shuffle of the int8 table elsewhere (lanes.h, lookup_i8_words).
template <int S>
inline lanes::f32x16 kvalue_words(const uint8_t* p) {
  if constexpr (lanes::kLookupPermutes) {
    return kvalue_lanes(lanes::load_words(p) >> S);
  } else {
    return lanes::lookup_i8_words<S>(kKvalueBytes, p);
  }
}

}  // namespace cairn::codecs::mxfp4
