// llama.cpp's first 32-weight formats, what `llama-quantize` falls back to when a row is not whole
// 256-weight blocks (V4's indexer position bias is 128 wide: Q5_0 in a Q4_K_M file, Q4_0 in a Q2_K
// one). A block: f16 d, [f16 m], [a little-endian u32 of fifth bits], 16 code bytes whose low nibbles
// are weights 0-15 and high nibbles 16-31. Fifth bit j of the u32 goes on top of weight j's nibble.
//   Q4_0 (18 bytes): w = fl(d * (q - 8))      Q4_1 (20): w = fl(fl(d * q) + m)
//   Q5_0 (22 bytes): w = fl(d * (q - 16))     Q5_1 (24): w = fl(fl(d * q) + m)
// gguf.quants' order: the code becomes a (signed) integer first, then one product, then the sum.
#include "../formats/lanes.h"
#include "codec_impl.h"

namespace cairn::codecs {
namespace {

template <bool kMin, bool kHigh>
struct Legacy {
  static constexpr int kHighAt = kMin ? 4 : 2, kCodesAt = kHighAt + (kHigh ? 4 : 0), kBytes = kCodesAt + 16;
  static constexpr int kOffset = kMin ? 0 : (kHigh ? 16 : 8);  // with a min, codes are unsigned

  static void decode(const uint8_t* __restrict blk, float* __restrict out) {
    const float d = f16_at(blk), m = kMin ? f16_at(blk + 2) : 0.f;
    const uint32_t qh = kHigh ? le32(blk + kHighAt) : 0;
    const uint8_t* qs = blk + kCodesAt;
    for (int j = 0; j < 32; ++j) {
      const int q = ((qs[j % 16] >> (4 * (j / 16))) & 0xF) | (int)(((qh >> j) & 1) << 4);
      const float w = d * (float)(q - kOffset);
      out[j] = kMin ? w + m : w;
    }
  }

  // 16 rows at once (codec.h, decode_lanes): the same operations, one lane per row.
  static void decode_lanes(const uint8_t* __restrict b, float* __restrict out) {
    using namespace lanes;
    const f32x16 d = half_to_f32(load_le16(b));
    const f32x16 m = kMin ? half_to_f32(load_le16(b + 16 * 2)) : f32x16{};
    const u32x16 qh = kHigh ? load_le32(b + 16 * kHighAt) : u32x16{};
    for (int j = 0; j < 32; ++j) {
      const u32x16 q = ((load_u8(b + 16 * (kCodesAt + j % 16)) >> (4 * (j / 16))) & 0xFu) | (((qh >> j) & 1u) << 4);
      const f32x16 w = d * to_f32((i32x16)q - kOffset);
      store(out + 16 * j, kMin ? w + m : w);
    }
  }
};

template <bool kMin, bool kHigh>
constexpr BlockCodec legacy(const char* name, int ggml_type) {
  using Q = Legacy<kMin, kHigh>;
  return block_codec<Q::decode, Q::decode_lanes, 32, Q::kBytes>(name, ggml_type);
}

}  // namespace

const BlockCodec Q4_0 = legacy<false, false>("Q4_0", 2);
const BlockCodec Q4_1 = legacy<true, false>("Q4_1", 3);
const BlockCodec Q5_0 = legacy<false, true>("Q5_0", 6);
const BlockCodec Q5_1 = legacy<true, true>("Q5_1", 7);

}  // namespace cairn::codecs
