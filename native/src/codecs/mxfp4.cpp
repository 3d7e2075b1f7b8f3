// MXFP4: 32 weights per 17-byte block: an e8m0 exponent byte e, then 16 bytes of 4-bit e2m1 codes
// (low nibbles are weights 0-15, high nibbles 16-31). The scale is half of 2^(e - 127), as
// ggml_e8m0_to_fp32_half builds it (subnormal for e < 2), and the table holds doubled e2m1 values:
// w = fl(scale * kvalue). In a panel the code bytes are 4-byte words (codec.h, lane_byte).
#include "mxfp4_lanes.h"

namespace cairn::codecs {
namespace {

using mxfp4::e8m0_half;
using mxfp4::kvalue_bits;

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

// 16 rows at once (codec.h, decode_lanes): the scale and the values lane-wise (mxfp4_lanes.h).
void decode_lanes(const uint8_t* __restrict b, float* __restrict out) {
  using namespace lanes;
  const f32x16 d = mxfp4::e8m0_half_lanes(load_u8(b));
  for (int i = 0; i < 16; i += 4) {
    const uint8_t* w = b + 16 * (1 + i);  // the words of code bytes i .. i + 3
    store(out + 16 * i, d * mxfp4::kvalue_words<0>(w));
    store(out + 16 * (i + 1), d * mxfp4::kvalue_words<8>(w));
    store(out + 16 * (i + 2), d * mxfp4::kvalue_words<16>(w));
    store(out + 16 * (i + 3), d * mxfp4::kvalue_words<24>(w));
    store(out + 16 * (16 + i), d * mxfp4::kvalue_words<4>(w));
    store(out + 16 * (17 + i), d * mxfp4::kvalue_words<12>(w));
    store(out + 16 * (18 + i), d * mxfp4::kvalue_words<20>(w));
    store(out + 16 * (19 + i), d * mxfp4::kvalue_words<28>(w));
  }
}

}  // namespace

const BlockCodec MXFP4{"MXFP4", 39, 32, 17, decode, decode_each<decode, 32, 17>, decode_lanes, 1, 17};

}  // namespace cairn::codecs
