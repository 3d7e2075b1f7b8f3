// The non-linear 4-bit formats: a code is an index into codec_tables::iq4nl_kvalues (16 int8 values).
//   IQ4_NL: 32 weights per 18-byte block: f16 d, 16 code bytes (low nibbles weights 0-15, high 16-31);
//           w = fl(d * kvalue). `llama-quantize`'s fallback for the IQ types on rows that are not
//           whole 256-weight blocks.
//   IQ4_XS: 256 weights per 136-byte block: f16 d, a u16 of eight 2-bit high scale parts, 4 bytes of
//           eight 4-bit low parts (sub-block 2i in byte i's low nibble, 2i + 1 in its high one), then
//           sub-block s's 16 code bytes at 8 + 16s, laid out as IQ4_NL's.
//           dl = fl(d * (scale - 32)), w = fl(dl * kvalue), in gguf.quants' order.
#include "../formats/lanes.h"
#include "codec_impl.h"
#include "tables.h"

namespace cairn::codecs {
namespace {

using codec_tables::iq4nl_kvalues;

// The 32 weights of one 16-byte code run, times the scale.
inline void run32(float d, const uint8_t* qs, float* out) {
  for (int j = 0; j < 16; ++j) {
    out[j] = d * (float)iq4nl_kvalues[qs[j] & 0xF];
    out[16 + j] = d * (float)iq4nl_kvalues[qs[j] >> 4];
  }
}

// The same for 16 rows (codec.h, lane_byte): lane l of code byte j at qs[16 j + l].
inline void run32_lanes(lanes::f32x16 d, const uint8_t* qs, float* out) {
  using namespace lanes;
  u8x16 table;
  std::memcpy(&table, iq4nl_kvalues, 16);
  for (int j = 0; j < 16; ++j) {
    const u8x16 c = load_bytes(qs + 16 * j);
    store(out + 16 * j, d * lookup_i8(table, c));
    store(out + 16 * (16 + j), d * lookup_i8(table, c >> 4));
  }
}

void nl_decode(const uint8_t* __restrict blk, float* __restrict out) { run32(f16_at(blk), blk + 2, out); }

void nl_decode_lanes(const uint8_t* __restrict b, float* __restrict out) {
  run32_lanes(lanes::half_to_f32(lanes::load_le16(b)), b + 16 * 2, out);
}

inline int xs_scale(uint16_t hi, const uint8_t* lo, int s) {
  return (((lo[s / 2] >> (4 * (s % 2))) & 0xF) | (((hi >> (2 * s)) & 3) << 4)) - 32;
}

void xs_decode(const uint8_t* __restrict blk, float* __restrict out) {
  const float d = f16_at(blk);
  const uint16_t hi = le16(blk + 2);
  for (int s = 0; s < 8; ++s) run32(d * (float)xs_scale(hi, blk + 4, s), blk + 8 + 16 * s, out + 32 * s);
}

void xs_decode_lanes(const uint8_t* __restrict b, float* __restrict out) {
  using namespace lanes;
  const f32x16 d = half_to_f32(load_le16(b));
  const u32x16 hi = load_le16(b + 16 * 2);
  for (int s = 0; s < 8; ++s) {
    const u32x16 lo = (load_u8(b + 16 * (4 + s / 2)) >> (4 * (s % 2))) & 0xFu;
    const f32x16 dl = d * to_f32((i32x16)(lo | (((hi >> (2 * s)) & 3u) << 4)) - 32);
    run32_lanes(dl, b + 16 * (8 + 16 * s), out + 16 * 32 * s);
  }
}

}  // namespace

const BlockCodec IQ4_NL = block_codec<nl_decode, nl_decode_lanes, 32, 18>("IQ4_NL", 20);
const BlockCodec IQ4_XS = block_codec<xs_decode, xs_decode_lanes, 256, 136>("IQ4_XS", 23);

}  // namespace cairn::codecs
