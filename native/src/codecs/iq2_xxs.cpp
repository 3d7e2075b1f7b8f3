// IQ2_XXS: 256 weights per 66-byte block: f16 d, then 8 groups of 32 weights in 8 bytes each:
// 4 grid indices (one byte per 8 weights; codec_tables::iq2xxs_grid gives their magnitudes), then a
// little-endian u32 of four 7-bit sign indices (codec_tables::iq2xxs_ksigns) and a 4-bit scale s.
// db = fl(fl(d * (0.5 + s)) * 0.25), w = fl(db * grid) * (+-1), in gguf.quants' order.
#include "../formats/lanes.h"
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

// Lane form. The grid's magnitudes are 8, 25 and 43 only, so a grid point packs into 16 bits, two
// per magnitude code c (0, 1, 2): one 32-bit gather per 8 weights of 16 rows, then the magnitude is
// 8 + 17c + c / 2, by a register permute on AVX-512 and in integers elsewhere (GCC 12 makes a
// 16-lane shuffle scalar on AVX2).
// The sign bytes are the 7 index bits with their parity as bit 7, computed rather than looked up.
struct Grid2 {
  uint32_t code[256];
};
constexpr int magnitude_code(uint8_t v) { return v == 8 ? 0 : v == 25 ? 1 : v == 43 ? 2 : -1; }
constexpr Grid2 grid2() {
  Grid2 g{};
  for (int p = 0; p < 256; ++p)
    for (int m = 0; m < 8; ++m)
      g.code[p] |= (uint32_t)magnitude_code(codec_tables::iq2xxs_grid[8 * p + m]) << (2 * m);
  return g;
}
constexpr bool grid_is_8_25_43() {
  for (uint8_t v : codec_tables::iq2xxs_grid)
    if (magnitude_code(v) < 0) return false;
  return true;
}
static_assert(grid_is_8_25_43(), "IQ2_XXS: a grid magnitude other than 8, 25, 43; grid2() cannot hold it");
static_assert(8 + 17 * 1 + 1 / 2 == 25 && 8 + 17 * 2 + 2 / 2 == 43, "magnitude from its code");
alignas(64) constexpr Grid2 kGrid2 = grid2();

template <class U>
constexpr U ksign(U x) {  // x < 128 -> x with bit 7 the parity of its 7 bits
  U p = x ^ (x >> 4);
  p ^= p >> 2;
  p ^= p >> 1;
  return x | ((p & 1) << 7);
}
constexpr bool ksigns_match() {
  for (uint32_t x = 0; x < 128; ++x)
    if (ksign(x) != codec_tables::iq2xxs_ksigns[x]) return false;
  return true;
}
static_assert(ksigns_match(), "IQ2_XXS: ksign() disagrees with codec_tables::iq2xxs_ksigns");

void decode_lanes(const uint8_t* __restrict b, float* __restrict out) {
  using namespace lanes;
  const f32x16 d = half_to_f32(load_le16(b));
  const f32x16 kMags = {8.0f, 25.0f, 43.0f};   // a register permute where lookup() is one (lanes.h)
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
        if constexpr (kLookupPermutes) mag = lookup(kMags, c);
        else mag = to_f32((c << 4) + c + (c >> 1) + 8u);
        store(out + 16 * (32 * g + 8 * i + m), db * mag * sign);
      }
    }
  }
}

}  // namespace

const BlockCodec IQ2_XXS{"IQ2_XXS", 16, 256, 66, decode, decode_each<decode, 256, 66>, decode_lanes};

}  // namespace cairn::codecs
