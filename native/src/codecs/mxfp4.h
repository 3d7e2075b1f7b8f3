// MXFP4: 32 weights per 17-byte block: an e8m0 exponent byte e, then 16 bytes of 4-bit e2m1 codes
// (low nibbles are weights 0-15, high nibbles 16-31). The scale is half of 2^(e - 127), as
// ggml_e8m0_to_fp32_half builds it (subnormal for e < 2), and the table holds doubled e2m1 values:
// w = fl(scale * kvalue) (mxfp4_lanes.h). In a panel the code bytes are 4-byte words (codec.h,
// lane_byte); column l < 16 is the low nibble of code byte l, column 16 + l its high nibble (part 1).
#pragma once
#include "format.h"
#include "mxfp4_lanes.h"

namespace cairn::kq {

struct MXFP4 {
  static constexpr const char* kName = "MXFP4";
  static constexpr int kType = 39;
  static constexpr int kBlock = 32, kBytes = 17, kSub = 32, kGroup = 32, kParts = 2;
  static constexpr int kWordsLo = 1, kWordsHi = 17;

  // The 16 code bytes hold weights 0-15 in their low nibbles and 16-31 in their high ones, a layout
  // GCC's loop vectorizer does not see through; GCC/Clang vector types (lowered to whatever the
  // target has) take the 16 bytes at once.
  static void decode(const uint8_t* __restrict blk, float* __restrict out) {
    using namespace codecs::mxfp4;
    const float d = e8m0_half(blk[0]);
    lanes::u8x16 q;
    std::memcpy(&q, blk + 1, 16);
    const u32x16 lo = kvalue_bits(__builtin_convertvector(q & 0xF, u32x16));
    const u32x16 hi = kvalue_bits(__builtin_convertvector(q >> 4, u32x16));
    const f32x16 a = d * (f32x16)lo, b = d * (f32x16)hi;   // the casts reinterpret bits
    std::memcpy(out, &a, 64);
    std::memcpy(out + 16, &b, 64);
  }

  static void scales(const uint8_t* b, f32x16* D, f32x16*) { D[0] = codecs::mxfp4::e8m0_half_lanes(lanes::load_u8(b)); }
  struct Group {
    const uint8_t* q;
    f32x16 d;
    static constexpr int kWordCols = 4;
    template <int P, int S>  // column l + S, l a multiple of 4
    f32x16 at(int l) const { return d * codecs::mxfp4::kvalue_words<8 * S + 4 * P>(q + 16 * l); }
  };
  static Group group(const uint8_t* b, int, const f32x16* D, const f32x16*) { return {b + 16, D[0]}; }

  // The codes alone, for the scaled chain (formats/pow2_chain.h, Mxfp4Pow2): the doubled e2m1
  // values, w = kv * 2^(e - 128); the e8m0 bytes go to the chain's factors.
  struct Codes {
    static constexpr int kBlock = MXFP4::kBlock, kBytes = MXFP4::kBytes, kSub = MXFP4::kSub;
    static constexpr int kGroup = MXFP4::kGroup, kParts = MXFP4::kParts;
    static void scales(const uint8_t*, f32x16*, f32x16*) {}
    struct Group {
      const uint8_t* q;
      static constexpr int kWordCols = 4;
      template <int P, int S>
      f32x16 at(int l) const { return codecs::mxfp4::kvalue_words<8 * S + 4 * P>(q + 16 * l); }
    };
    static Group group(const uint8_t* b, int, const f32x16*, const f32x16*) { return {b + 16}; }
  };
};

}  // namespace cairn::kq
