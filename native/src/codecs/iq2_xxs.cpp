// IQ2_XXS: 256 weights per 66-byte block: f16 d, then 8 groups of 32 weights in 8 bytes each:
// 4 grid indices (one byte per 8 weights; codec_tables::iq2xxs_grid gives their magnitudes), then a
// little-endian u32 of four 7-bit sign indices (codec_tables::iq2xxs_ksigns) and a 4-bit scale s.
// db = fl(fl(d * (0.5 + s)) * 0.25), w = fl(db * grid) * (+-1), in gguf.quants' order.
#include "codec_impl.h"
#include "tables.h"

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

}  // namespace

const BlockCodec IQ2_XXS{"IQ2_XXS", 16, 256, 66, decode, decode_each<decode, 256, 66>};

}  // namespace cairn::codecs
