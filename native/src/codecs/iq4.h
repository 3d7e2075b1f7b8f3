// The non-linear 4-bit formats: a code is an index into codec_tables::iq4nl_kvalues (16 int8 values).
//   IQ4_NL: 32 weights per 18-byte block: f16 d, 16 code bytes (low nibbles weights 0-15, high 16-31);
//           w = fl(d * kvalue). `llama-quantize`'s fallback for the IQ types on rows that are not
//           whole 256-weight blocks.
//   IQ4_XS: 256 weights per 136-byte block: f16 d, a u16 of eight 2-bit high scale parts, 4 bytes of
//           eight 4-bit low parts (sub-block 2i in byte i's low nibble, 2i + 1 in its high one), then
//           sub-block s's 16 code bytes at 8 + 16s, laid out as IQ4_NL's.
//           dl = fl(d * (scale - 32)), w = fl(dl * kvalue), in gguf.quants' order.
// In lanes a group is a 32-column run of 16 code bytes, parts low / high nibble; the kvalue is a
// float table's entry on AVX-512, a byte shuffle elsewhere.
#pragma once
#include <utility>

#include "format.h"
#include "tables.h"

namespace cairn::kq {

template <size_t... I>
constexpr f32x16 iq4_table(std::index_sequence<I...>) { return f32x16{(float)codec_tables::iq4nl_kvalues[I]...}; }
inline f32x16 iq4_value(const uint8_t* p, int shift) {
  if constexpr (lanes::kLookupPermutes) {
    constexpr f32x16 t = iq4_table(std::make_index_sequence<16>{});
    return lanes::lookup(t, lanes::load_u8(p) >> shift);
  } else {
    lanes::u8x16 t;
    std::memcpy(&t, codec_tables::iq4nl_kvalues, 16);
    return lanes::lookup_i8(t, lanes::load_bytes(p) >> shift);
  }
}

template <int kBlock_, int kCodesAt>
struct IQ4 {
  static constexpr const char* kName = kBlock_ == 32 ? "IQ4_NL" : "IQ4_XS";
  static constexpr int kType = kBlock_ == 32 ? 20 : 23;
  static constexpr int kBlock = kBlock_, kBytes = kBlock == 32 ? 18 : 136, kSub = 32, kGroup = 32, kParts = 2;

  // The 32 weights of one 16-byte code run, times the scale.
  static void run32(float d, const uint8_t* qs, float* out) {
    for (int j = 0; j < 16; ++j) {
      out[j] = d * (float)codec_tables::iq4nl_kvalues[qs[j] & 0xF];
      out[16 + j] = d * (float)codec_tables::iq4nl_kvalues[qs[j] >> 4];
    }
  }
  static void decode(const uint8_t* __restrict blk, float* __restrict out) {
    using namespace codecs;
    const float d = f16_at(blk);
    if constexpr (kBlock == 32) {
      run32(d, blk + kCodesAt, out);
    } else {
      const uint16_t hi = le16(blk + 2);
      const uint8_t* lo = blk + 4;
      for (int s = 0; s < 8; ++s) {
        const int sc = (((lo[s / 2] >> (4 * (s % 2))) & 0xF) | (((hi >> (2 * s)) & 3) << 4)) - 32;
        run32(d * (float)sc, blk + kCodesAt + 16 * s, out + 32 * s);
      }
    }
  }

  static void scales(const uint8_t* b, f32x16* D, f32x16*) {
    const f32x16 d = lanes::half_to_f32(lanes::load_le16(b));
    if constexpr (kBlock == 32) {
      D[0] = d;
    } else {
      const u32x16 hi = lanes::load_le16(b + 16 * 2);
      for (int s = 0; s < 8; ++s) {
        const u32x16 lo = (lanes::load_u8(b + 16 * (4 + s / 2)) >> (4 * (s % 2))) & 0xFu;
        D[s] = d * lanes::to_f32((i32x16)(lo | (((hi >> (2 * s)) & 3u) << 4)) - 32);
      }
    }
  }
  struct Group {
    const uint8_t* q;
    f32x16 d;
    template <int P>
    f32x16 at(int l) const { return d * iq4_value(q + 16 * l, 4 * P); }
  };
  static Group group(const uint8_t* b, int r, const f32x16* D, const f32x16*) {
    return {b + 16 * (kCodesAt + 16 * (r / 32)), D[0]};
  }
};
using IQ4NL = IQ4<32, 2>;
using IQ4XS = IQ4<256, 8>;

}  // namespace cairn::kq
