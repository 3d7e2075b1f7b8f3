// MXFP4: 32 weights per 17-byte block: an e8m0 exponent byte e, then 16 bytes of 4-bit e2m1 codes
// (low nibbles are weights 0-15, high nibbles 16-31). The scale is half of 2^(e - 127), as
// ggml_e8m0_to_fp32_half builds it (subnormal for e < 2), and the table holds doubled e2m1 values:
// w = fl(scale * kvalue).
#include <utility>

#include "../formats/lanes.h"
#include "codec_impl.h"
#include "tables.h"

// kvalue_bits() below returns a 64-byte vector; it is internal to this file (inlined), so the
// warning that such a return differs in ABI without AVX-512 (the v2, v3 and aarch64 builds) is moot.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace cairn::codecs {
namespace {

inline float e8m0_half(uint8_t e) {
  return bits_f32(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
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

// The 16 code bytes hold weights 0-15 in their low nibbles and 16-31 in their high ones, a layout
// GCC's loop vectorizer does not see through; GCC/Clang vector types (lowered to whatever the
// target has) take the 16 bytes at once.
using lanes::f32x16;
using lanes::u32x16;
using lanes::u8x16;

inline void decode(const uint8_t* __restrict blk, float* __restrict out) {
  const float d = e8m0_half(blk[0]);
  u8x16 q;
  std::memcpy(&q, blk + 1, 16);
  const u32x16 lo = kvalue_bits(__builtin_convertvector(q & 0xF, u32x16));
  const u32x16 hi = kvalue_bits(__builtin_convertvector(q >> 4, u32x16));
  const f32x16 a = d * (f32x16)lo, b = d * (f32x16)hi;   // the casts reinterpret bits
  std::memcpy(out, &a, 64);
  std::memcpy(out + 16, &b, 64);
}

// The doubled e2m1 values as floats, for lanes::lookup (kvalues_match: the same bits as kvalue_bits).
template <size_t... C>
constexpr lanes::f32x16 kvalue_table(std::index_sequence<C...>) {
  return lanes::f32x16{(float)codec_tables::mxfp4_kvalues[C]...};
}

// 16 rows at once (codec.h, decode_lanes): e8m0_half and the kvalues lane-wise, from a register
// table where that is one permute, else kvalue_bits.
void decode_lanes(const uint8_t* __restrict b, float* __restrict out) {
  using namespace lanes;
  constexpr f32x16 table = kvalue_table(std::make_index_sequence<16>());
  const auto kvalue = [&](u32x16 c) {
    if constexpr (kLookupPermutes) return lookup(table, c);
    else return bits(kvalue_bits(c));
  };
  const u32x16 e = load_u8(b);
  // e8m0_half: e < 2 is (e + 1) << 21 (0x00200000 << e); masks, not a compare (lanes.h, half_to_f32)
  const u32x16 e1 = e >> 1, low = ((e1 | (0u - e1)) >> 31) - 1u;   // all ones where e < 2
  const f32x16 d = bits((((e + 1u) << 21) & low) | (((e - 1u) << 23) & ~low));
  for (int i = 0; i < 16; ++i) {
    const u32x16 q = load_u8(b + 16 * (1 + i));
    store(out + 16 * i, d * kvalue(q & 0xFu));
    store(out + 16 * (16 + i), d * kvalue(q >> 4));
  }
}

}  // namespace

const BlockCodec MXFP4{"MXFP4", 39, 32, 17, decode, decode_each<decode, 32, 17>, decode_lanes};

}  // namespace cairn::codecs
