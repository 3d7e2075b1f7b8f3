// Q4_K and Q5_K: the 12-byte field of eight 6-bit scales and eight 6-bit mins
// (gguf.quants.Q4_K.get_scale_min). Bytes 0-3 hold scales 0-3 in their low 6 bits, bytes 4-7 mins
// 0-3; bytes 8-11 hold the low 4 bits of scales 4-7 (low nibble) and mins 4-7 (high nibble), whose
// top 2 bits are the top 2 bits of bytes 0-3 (scales) and 4-7 (mins).
#pragma once
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

}  // namespace cairn::codecs
