// Q4_K and Q5_K: the 12-byte field of eight 6-bit scales and eight 6-bit mins
// (gguf.quants.Q4_K.get_scale_min). Bytes 0-3 hold scales 0-3 in their low 6 bits, bytes 4-7 mins
// 0-3; bytes 8-11 hold the low 4 bits of scales 4-7 (low nibble) and mins 4-7 (high nibble), whose
// top 2 bits are the top 2 bits of bytes 0-3 (scales) and 4-7 (mins).
#pragma once
#include "../formats/lanes.h"
#include "codec_impl.h"

namespace cairn::codecs {

inline void k_scale_min(const uint8_t* s, uint8_t sc[8], uint8_t mn[8]) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 0x3F;
    mn[j] = s[j + 4] & 0x3F;
    sc[j + 4] = (uint8_t)((s[j + 8] & 0x0F) | ((s[j] >> 6) << 4));
    mn[j + 4] = (uint8_t)((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
  }
}

// The same field of 16 byte-interleaved blocks (s: byte 0 of the field, lanes.h), times the
// lanes' d and dmin: D[s] = fl(d * sc_s), M[s] = fl(dmin * m_s).
inline void k_scale_min_lanes(const uint8_t* s, lanes::f32x16 d, lanes::f32x16 dmin, lanes::f32x16 D[8],
                              lanes::f32x16 M[8]) {
  using namespace lanes;
  for (int j = 0; j < 4; ++j) {
    const u32x16 a = load_u8(s + 16 * j), m = load_u8(s + 16 * (j + 4)), h = load_u8(s + 16 * (j + 8));
    D[j] = d * to_f32(a & 0x3Fu);
    M[j] = dmin * to_f32(m & 0x3Fu);
    D[j + 4] = d * to_f32((h & 0x0Fu) | ((a >> 6) << 4));
    M[j + 4] = dmin * to_f32((h >> 4) | ((m >> 6) << 4));
  }
}

}  // namespace cairn::codecs
