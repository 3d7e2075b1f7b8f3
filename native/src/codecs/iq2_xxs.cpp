// IQ2_XXS: 256 weights per 66-byte block: f16 d, then 8 groups of 32 weights in 8 bytes each:
// 4 grid indices (one byte per 8 weights; codec_tables::iq2xxs_grid gives their magnitudes), then a
// little-endian u32 of four 7-bit sign indices (codec_tables::iq2xxs_ksigns) and a 4-bit scale s.
// db = fl(fl(d * (0.5 + s)) * 0.25), w = fl(db * grid) * (+-1), in gguf.quants' order.
#include "../formats/lanes.h"
#include "codec_impl.h"
#include "iq2_xxs_grid.h"

namespace cairn::codecs {
namespace {

inline void decode(const uint8_t* __restrict blk, float* __restrict out) {
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

// Lane form: iq2_xxs_grid.h's packed grid and computed signs.
void decode_lanes(const uint8_t* __restrict b, float* __restrict out) {
  using namespace lanes;
  const f32x16 d = half_to_f32(load_le16(b));
  const f32x16 kMags = {8.0f, 25.0f, 43.0f};   // a register permute where lookup8() is one (lanes.h)
  for (int g = 0; g < 8; ++g) {
    const uint8_t* p = b + 16 * (2 + 8 * g);
    const u32x16 aux1 = load_le32(p + 16 * 4);
    const f32x16 db = d * (0.5f + to_f32(aux1 >> 28)) * 0.25f;
    for (int i = 0; i < 4; ++i) {
      const u32x16 code = gather_u32(kGrid2.code, load_u8(p + 16 * i));
      const u32x16 neg = ksign((aux1 >> (7 * i)) & 0x7Fu);
      for (int m = 0; m < 8; ++m) {
        const f32x16 sign = bits(0x3f800000u | (((neg >> m) & 1u) << 31));  // +-1.0f
        const u32x16 c = (code >> (2 * m)) & 3u;
        f32x16 mag;
        if constexpr (kLookup8Permutes) mag = lookup8(kMags, c);  // c < 4
        else mag = to_f32((c << 4) + c + (c >> 1) + 8u);
        store(out + 16 * (32 * g + 8 * i + m), db * mag * sign);
      }
    }
  }
}

}  // namespace

const BlockCodec IQ2_XXS{"IQ2_XXS", 16, 256, 66, decode, decode_each<decode, 256, 66>, decode_lanes};

}  // namespace cairn::codecs
