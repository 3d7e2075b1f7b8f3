// F32, F16, BF16: one weight per "block", widened exactly (gguf.quants.dequantize: a view, a
// float16 -> float32 cast, and BF16's `int16 << 16` reinterpreted). They share the codec table so
// every GGUF type a loader meets goes through find_codec.
#include "../formats/lanes.h"
#include "codec_impl.h"

namespace cairn::codecs {
namespace {

void f32_decode(const uint8_t* blk, float* out) { std::memcpy(out, blk, 4); }
void f32_blocks(const uint8_t* blk, int n, float* out) { std::memcpy(out, blk, (size_t)n * 4); }

void f16_decode(const uint8_t* blk, float* out) { out[0] = f16_at(blk); }
void f16_blocks(const uint8_t* blk, int n, float* out) {
  for (int i = 0; i < n; ++i) out[i] = f16_at(blk + 2 * (size_t)i);
}

void bf16_decode(const uint8_t* blk, float* out) { out[0] = bits_f32((uint32_t)le16(blk) << 16); }
void bf16_blocks(const uint8_t* blk, int n, float* out) {
  for (int i = 0; i < n; ++i) out[i] = bits_f32((uint32_t)le16(blk + 2 * (size_t)i) << 16);
}

// Lane forms (codec.h, decode_lanes): one weight per row, its bytes 16 apart.
void f32_lanes(const uint8_t* b, float* out) { lanes::store(out, lanes::bits(lanes::load_le32(b))); }
void f16_lanes(const uint8_t* b, float* out) { lanes::store(out, lanes::half_to_f32(lanes::load_le16(b))); }
void bf16_lanes(const uint8_t* b, float* out) { lanes::store(out, lanes::bits(lanes::load_le16(b) << 16)); }

}  // namespace

const BlockCodec F32{"F32", 0, 1, 4, f32_decode, f32_blocks, f32_lanes};
const BlockCodec F16{"F16", 1, 1, 2, f16_decode, f16_blocks, f16_lanes};
const BlockCodec BF16{"BF16", 30, 1, 2, bf16_decode, bf16_blocks, bf16_lanes};

}  // namespace cairn::codecs
