// cairn kernel: 16 fp32 lanes (one panel row) as GCC vector types. A codec's widening is written
// once against these; the compiler emits it for the build's ISA (one zmm on AVX-512, two ymm on
// AVX2, NEON quads on aarch64, scalar code elsewhere). docs/architecture.md says why not Highway.
#pragma once
#include <cstdint>
#include <cstring>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "cairn/kernels.h"

namespace cairn::lanes {

static_assert(kPanel == 16, "a panel row is 16 lanes");
typedef float f32x16 __attribute__((vector_size(64)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
typedef uint8_t u8x16 __attribute__((vector_size(16)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint64_t u64x2 __attribute__((vector_size(16)));
typedef float f32x8 __attribute__((vector_size(32)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));

// The halves of 16 lanes as 8-lane vectors (one ymm each on AVX2) and back, as shuffles the compiler
// sees through: a copy through memory between them left 16-byte stores under 32-byte loads, which
// stall. (Joins of loaded halves stay copies: GCC 12 lowers those better than a join shuffle.)
template <int H, class V>
inline auto half(V v) {
  return __builtin_shufflevector(v, v, 8 * H, 8 * H + 1, 8 * H + 2, 8 * H + 3, 8 * H + 4, 8 * H + 5, 8 * H + 6, 8 * H + 7);
}
template <class V>
inline auto join(V a, V b) {
  return __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

// Widening loads: GCC 12 turns __builtin_convertvector of a loaded byte vector into byte-by-byte
// inserts, so where the ISA has a widening load it is named here (and only here).
inline u32x16 load_u8(const uint8_t* p) {  // 16 bytes, zero-extended
#if defined(__AVX512F__)
  return (u32x16)_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
#elif defined(__AVX2__)
  const __m128i b = _mm_loadu_si128((const __m128i*)p);
  const __m256i lo = _mm256_cvtepu8_epi32(b), hi = _mm256_cvtepu8_epi32(_mm_srli_si128(b, 8));
  u32x16 r;
  std::memcpy(&r, &lo, 32);
  std::memcpy((char*)&r + 32, &hi, 32);
  return r;
#else
  u32x16 r;
  for (int l = 0; l < 16; ++l) r[l] = p[l];
  return r;
#endif
}
inline u32x16 load_u16(const uint16_t* p) {
#if defined(__AVX512F__)
  return (u32x16)_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p));
#elif defined(__AVX2__)
  const __m256i lo = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p));
  const __m256i hi = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(p + 8)));
  u32x16 r;
  std::memcpy(&r, &lo, 32);
  std::memcpy((char*)&r + 32, &hi, 32);
  return r;
#else
  u32x16 r;
  for (int l = 0; l < 16; ++l) r[l] = p[l];
  return r;
#endif
}
// 16 lanes' 4-byte words side by side (a codec's word range, codecs/codec.h): one plain load
inline u32x16 load_words(const uint8_t* p) {
  u32x16 v;
  std::memcpy(&v, p, 64);
  return v;
}
inline u8x16 load_bytes(const uint8_t* p) {
  u8x16 v;
  std::memcpy(&v, p, 16);
  return v;
}
// 8 bytes -> byte l holds nibble l&1 (low first) of byte l/2
inline u8x16 nibbles8(const uint8_t* p) {
  uint64_t x;
  std::memcpy(&x, p, 8);
  const u8x16 q = (u8x16)(u64x2){x, 0};  // one 8-byte load (a byte-wise copy into a vector stalls on store forwarding)
  const u8x16 hi = q >> 4;
  return __builtin_shufflevector(q, hi, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23) & 15;
}
inline u32x16 load_nibbles(const uint8_t* p) { return __builtin_convertvector(nibbles8(p), u32x16); }
// 16 bytes in a register, sign-extended
inline i32x16 widen_i8(u8x16 b) {
#if defined(__AVX512F__)
  return (i32x16)_mm512_cvtepi8_epi32((__m128i)b);
#elif defined(__AVX2__)
  const __m256i lo = _mm256_cvtepi8_epi32((__m128i)b), hi = _mm256_cvtepi8_epi32(_mm_srli_si128((__m128i)b, 8));
  i32x16 r;
  std::memcpy(&r, &lo, 32);
  std::memcpy((char*)&r + 32, &hi, 32);
  return r;
#else
  i32x16 r;
  for (int l = 0; l < 16; ++l) r[l] = (int8_t)b[l];
  return r;
#endif
}
// 16 bytes, sign-extended (int8 codes)
inline i32x16 load_i8(const uint8_t* p) { return widen_i8(load_bytes(p)); }
// Byte-interleaved blocks of 16 rows (codecs/codec.h, decode_lanes: byte i of lane l at p[16i + l]):
// the little-endian 16- and 32-bit fields starting at byte i, from p + 16i.
inline u32x16 load_le16(const uint8_t* p) { return load_u8(p) | (load_u8(p + 16) << 8); }
inline u32x16 load_le32(const uint8_t* p) { return load_le16(p) | (load_le16(p + 32) << 16); }
inline f32x16 load_f32(const float* p) {
  f32x16 v;
  std::memcpy(&v, p, 64);
  return v;
}
inline void store(float* p, f32x16 v) { std::memcpy(p, &v, 64); }
inline f32x16 bits(u32x16 x) { return (f32x16)x; }
inline u32x16 bits(f32x16 x) { return (u32x16)x; }
inline f32x16 to_f32(u32x16 x) { return __builtin_convertvector((i32x16)x, f32x16); }
inline f32x16 to_f32(i32x16 x) { return __builtin_convertvector(x, f32x16); }
// IEEE half bit patterns (low 16 bits of each lane) -> float, exact: the integer construction of
// codecs/codec_impl.h's f16_to_f32, lane-wise, so NaN payloads (signalling ones too) are kept as
// numpy's float16 -> float32 cast keeps them. Not F16C's cvtph: it quiets signalling NaNs, and F16
// weights go through here too; the few integer operations per lane are cheap next to a block's work.
inline f32x16 half_to_f32(u32x16 h) {
  const u32x16 em = (h & 0x7fffu) << 13, e = em & 0x0f800000u;
  // all ones where the exponent is 31 / 0; carries, not compares (GCC 12 turns a compare of a vector
  // wider than the ISA's into lane-by-lane scalar code)
  const u32x16 is_max = 0u - ((e + (1u << 23)) >> 28), is_sub = ((e | (0u - e)) >> 31) - 1u;
  const u32x16 normal = em + (112u << 23) + (is_max & (112u << 23));
  const u32x16 sub = bits(to_f32(h & 0x3ffu) * 0x1p-24f);  // subnormal (and zero): exact
  return bits(((normal & ~is_sub) | (sub & is_sub)) | ((h & 0x8000u) << 16));
}
// The little-endian 32-bit word idx[l] of a byte table (bytes 4 idx[l] .. + 3): the IQ grids' points
// of 4 (or, two words, 8) byte values.
inline u32x16 gather_words(const uint8_t* table, u32x16 idx) {
#if defined(__AVX512F__)
  return (u32x16)_mm512_i32gather_epi32((__m512i)idx, table, 4);
#elif defined(__AVX2__)
  __m256i i[2];
  std::memcpy(i, &idx, 64);
  const __m256i lo = _mm256_i32gather_epi32((const int*)table, i[0], 4);
  const __m256i hi = _mm256_i32gather_epi32((const int*)table, i[1], 4);
  u32x16 r;
  std::memcpy(&r, &lo, 32);
  std::memcpy((char*)&r + 32, &hi, 32);
  return r;
#else
  u32x16 r;
  for (int l = 0; l < 16; ++l) {
    uint32_t w;
    std::memcpy(&w, table + 4 * (size_t)idx[l], 4);
    r[l] = w;
  }
  return r;
#endif
}
// table[idx[l]] for a table of 32-bit words
inline u32x16 gather_u32(const uint32_t* table, u32x16 idx) {
  return gather_words(reinterpret_cast<const uint8_t*>(table), idx);
}
#if defined(__AVX512BW__)
// table[p[l]] for the 32 bytes at p and a 256-entry table of 16-bit words (64-byte aligned): lanes
// 0-15 into a, 16-31 into b, zero-extended. Four 64-entry word permutes chosen by index bits 6 and
// 7: a 16-lane gather costs more than all of them (IQ2_XXS's grid, codecs/iq2_xxs.h).
inline void lookup256_u16(const uint16_t* table, const uint8_t* p, u32x16& a, u32x16& b) {
  const __m512i idx = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)p));
  const __m512i* t = (const __m512i*)table;
  const __m512i q0 = _mm512_permutex2var_epi16(t[0], idx, t[1]), q1 = _mm512_permutex2var_epi16(t[2], idx, t[3]);
  const __m512i q2 = _mm512_permutex2var_epi16(t[4], idx, t[5]), q3 = _mm512_permutex2var_epi16(t[6], idx, t[7]);
  const __mmask32 b6 = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(64));
  const __mmask32 b7 = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(128));
  const __m512i w = _mm512_mask_blend_epi16(b7, _mm512_mask_blend_epi16(b6, q0, q1), _mm512_mask_blend_epi16(b6, q2, q3));
  a = (u32x16)_mm512_cvtepu16_epi32(_mm512_castsi512_si256(w));
  b = (u32x16)_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(w, 1));
}
#endif
// table[idx[l]] for a 16-entry table (a permute on AVX-512)
// Whether lookup() is one register permute (AVX-512): elsewhere GCC 12 lowers it lane by lane, and
// a codec with an arithmetic form of its table uses that instead (`if constexpr`).
#if defined(__AVX512F__)
constexpr bool kLookupPermutes = true;
#else
constexpr bool kLookupPermutes = false;
#endif
inline f32x16 lookup(f32x16 table, u32x16 idx) { return __builtin_shuffle(table, (i32x16)idx); }
// table[idx[l] & 7] for a table whose two halves are equal: one vpermps per 8 lanes on AVX2 (it reads
// an index's low 3 bits) and per 16 on AVX-512.
#if defined(__AVX2__)
constexpr bool kLookup8Permutes = true;
#else
constexpr bool kLookup8Permutes = false;
#endif
inline f32x16 lookup8(f32x16 table, u32x16 idx) {
#if defined(__AVX512F__)
  return lookup(table, idx);
#elif defined(__AVX2__)
  const __m256 t = (__m256)half<0>(table);
  return join((f32x8)_mm256_permutevar8x32_ps(t, (__m256i)half<0>(idx)),
              (f32x8)_mm256_permutevar8x32_ps(t, (__m256i)half<1>(idx)));
#else
  return lookup(table, idx & 7u);
#endif
}
// table[(word >> S) & 15] as floats for 16 lanes' words at p (a codec's word range, S a nibble's
// place) and a table of 16 small integers. For ISAs where lookup() is not a register permute: a
// byte shuffle (pshufb) looks up the nibble of all four bytes at once, the same for each of a word's
// four S of that nibble, which the compiler shares; two shifts pick the byte and sign-extend it. On
// AVX2 each half is loaded as its own ymm: GCC 12 split a loaded 16-lane vector partly by inserts.
// Elsewhere (SSE4.2, NEON) a quarter at a time, as GCC vectors.
template <int S>
inline f32x16 lookup_i8_words(u8x16 table, const uint8_t* p) {
  constexpr int nib = S % 8, byte = S / 8;
#if defined(__AVX2__)
  const __m256i t = _mm256_broadcastsi128_si256((__m128i)table), m = _mm256_set1_epi8(15);
  const auto one = [&](const uint8_t* h) {
    const __m256i w = _mm256_loadu_si256((const __m256i*)h);
    const __m256i v = _mm256_shuffle_epi8(t, _mm256_and_si256(nib ? _mm256_srli_epi32(w, nib) : w, m));
    return (f32x8)_mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 24 - 8 * byte), 24));
  };
  return join(one(p), one(p + 32));
#else
  // a quarter (4 lanes) at a time: the byte shuffle is pshufb on SSSE3, tbl on NEON
  typedef uint32_t u32x4 __attribute__((vector_size(16)));
  typedef int32_t i32x4 __attribute__((vector_size(16)));
  typedef float f32x4 __attribute__((vector_size(16)));
  f32x16 r;
  for (int q = 0; q < 4; ++q) {
    u32x4 w;
    std::memcpy(&w, p + 16 * q, 16);
    const u8x16 v = __builtin_shuffle(table, (u8x16)(w >> nib) & 15);
    const f32x4 f = __builtin_convertvector((i32x4)((u32x4)v << (24 - 8 * byte)) >> 24, f32x4);
    std::memcpy((char*)&r + 16 * q, &f, 16);
  }
  return r;
#endif
}
// table[idx[l] & 15] as floats for a table of 16 small integers: a byte shuffle (pshufb, tbl) and a
// sign extension, where lookup() is not a register permute (AVX2 and NEON have no 16-lane one).
inline f32x16 lookup_i8(u8x16 table, u8x16 idx) {
  return to_f32(widen_i8(__builtin_shuffle(table, (u8x16)(idx & 15))));
}
// 16 FP8 e4m3fn codes' values times 2^-8, exact (subnormals included; the NaN pattern reads as the
// finite 480 its bits spell). With F16C: the sign-extended byte << 7 with bit 14 cleared is the
// FP16 pattern of that value; elsewhere it is built from the bits.
inline f32x16 e4m3_x256(const uint8_t* p) {
#if defined(__AVX512F__)
  const __m256i h = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)p));
  return (f32x16)_mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(h, 7), _mm256_set1_epi16((short)0xBF80)));
#elif defined(__AVX2__) && defined(__F16C__)
  const __m128i b = _mm_loadu_si128((const __m128i*)p), mask = _mm_set1_epi16((short)0xBF80);
  const __m256 lo = _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(b), 7), mask));
  const __m256 hi = _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(_mm_srli_si128(b, 8)), 7), mask));
  f32x16 r;
  std::memcpy(&r, &lo, 32);
  std::memcpy((char*)&r + 32, &hi, 32);
  return r;
#else
  const u32x16 q = load_u8(p), sg = (q & 0x80u) << 24, e = (q >> 3) & 15u, m = q & 7u;
  const f32x16 normal = bits(sg | ((e + 112u) << 23) | (m << 20));
  const f32x16 sub = bits(bits(to_f32(m) * 0x1p-17f) | sg);  // m * 2^-9 * 2^-8
  return e != 0u ? normal : sub;
#endif
}
// b * a + c per lane, rounded once where the target has fused multiply-adds (kernels.h: fmadd)
inline f32x16 fmadd_lanes(float a, f32x16 b, f32x16 c) {
#if CAIRN_HAS_FMA
  f32x16 r;
  for (int l = 0; l < 16; ++l) r[l] = __builtin_fmaf(a, b[l], c[l]);  // vectorized to fma / fmla
  return r;
#else
  return a * b + c;
#endif
}
// a * b -/+ c per lane for a product that is exact in fp32, so one rounding (a fused multiply-subtract
// or -add, where the target has one) and two (the decoders' fl(fl(a * b) -/+ c)) give the same bits.
template <bool kSub>
inline f32x16 fused_exact(f32x16 a, f32x16 b, f32x16 c) {
#if defined(__AVX512F__)
  const __m512 x = (__m512)a, y = (__m512)b, z = (__m512)c;
  return (f32x16)(kSub ? _mm512_fmsub_ps(x, y, z) : _mm512_fmadd_ps(x, y, z));
#elif defined(__AVX2__) && defined(__FMA__)
  const auto one = [](f32x8 x, f32x8 y, f32x8 z) {
    return (f32x8)(kSub ? _mm256_fmsub_ps((__m256)x, (__m256)y, (__m256)z) : _mm256_fmadd_ps((__m256)x, (__m256)y, (__m256)z));
  };
  return join(one(half<0>(a), half<0>(b), half<0>(c)), one(half<1>(a), half<1>(b), half<1>(c)));
#else
  return kSub ? a * b - c : a * b + c;
#endif
}
inline f32x16 fmsub_exact(f32x16 a, f32x16 b, f32x16 c) { return fused_exact<true>(a, b, c); }
inline f32x16 fmadd_exact(f32x16 a, f32x16 b, f32x16 c) { return fused_exact<false>(a, b, c); }
// 2^(e - 127) per lane from exponent bytes (e < 255)
inline f32x16 exp2_bytes(const uint8_t* e) { return bits(load_u8(e) << 23); }

}  // namespace cairn::lanes
