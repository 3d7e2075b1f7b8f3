// IQ2_XXS's grid and signs in the forms its lane arithmetic (iq2_xxs.h) uses; the signs also serve
// IQ2_XS and IQ3_XXS.
#pragma once
#include <cstdint>

#include "tables.h"

namespace cairn::codecs {

// The grid's magnitudes are 8, 25 and 43 only, so a grid point packs into 16 bits, two
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
alignas(64) inline constexpr Grid2 kGrid2 = grid2();
// The same codes as 16-bit words (8 two-bit codes fill 16 bits), for a register lookup
// (lanes::lookup256_u16).
struct Grid2Words {
  uint16_t code[256];
};
constexpr Grid2Words grid2_words() {
  Grid2Words w{};
  for (int p = 0; p < 256; ++p) w.code[p] = (uint16_t)kGrid2.code[p];
  return w;
}
alignas(64) inline constexpr Grid2Words kGrid2Words = grid2_words();

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

}  // namespace cairn::codecs
