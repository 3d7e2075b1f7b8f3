// Shared by the format definitions (codecs/<format>.h) and the registry; not part of the codec interface.
//
// Every decoder mirrors gguf.quants' dequantize_blocks operation by operation in float32: each
// numpy product or difference is one rounding here. These files are compiled with
// -ffp-contract=off (native/CMakeLists.txt) so `a * b - c` is never fused into one rounding.
#pragma once
#include <cstdint>
#include <cstring>

#include "codec.h"

namespace cairn::codecs {

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint16_t le16(const uint8_t* p) { return (uint16_t)(p[0] | (p[1] << 8)); }
inline uint32_t le32(const uint8_t* p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

// IEEE half -> float, exact, in integer operations so a loop of them vectorizes. NaN payloads
// (signalling ones too) are kept as numpy's float16 -> float32 cast keeps them; the F16C
// instruction would quiet them, so it is not used.
inline float f16_to_f32(uint16_t h) {
  const uint32_t em = (uint32_t)(h & 0x7fff) << 13;     // exponent and mantissa, in float position
  const uint32_t e = em & 0x0f800000u;
  const uint32_t is_max = 0u - (uint32_t)(e == 0x0f800000u), is_sub = 0u - (uint32_t)(e == 0);
  // rebias 15 -> 127, and exponent 31 -> 255 with the payload kept; masks, not branches
  const uint32_t normal = em + (112u << 23) + (is_max & (112u << 23));
  const uint32_t sub = f32_bits((float)(h & 0x3ff) * 0x1p-24f);  // subnormal (and zero): exact
  return bits_f32(((normal & ~is_sub) | (sub & is_sub)) | ((uint32_t)(h & 0x8000) << 16));
}
inline float f16_at(const uint8_t* p) { return f16_to_f32(le16(p)); }

// decode_blocks for formats without a faster multi-block path: the per-block decoder, inlined.
template <void (*Decode)(const uint8_t*, float*), int Block, int Bytes>
void decode_each(const uint8_t* blk, int n, float* out) {
  for (int b = 0; b < n; ++b) Decode(blk + (size_t)b * Bytes, out + (size_t)b * Block);
}

}  // namespace cairn::codecs
