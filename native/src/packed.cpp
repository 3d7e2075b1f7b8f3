// cairn kernel: packed-panel GEMM for the weight matrices.
//
// Design notes
//  * Every nn.Linear weight W[N, K] is packed once at load into panels of kPanel output rows,
//    k-major inside a panel: P[ceil(N/16)][K][16], padding rows zero. The micro-kernel then
//    runs in broadcast form: per k it loads np panel vectors (contiguous, 64 B each) and
//    broadcasts one scalar of each of mr input rows -- mr x np FMAs per (np + mr) loads, no
//    horizontal sums, no per-call packing of B (OpenBLAS re-packs the whole weight on every
//    call, which dominates for the 30-130-row expert GEMMs of a chunk).
//  * Reduction order: every output is acc = fma(x[k], w[k], acc) for k = 0, 1, ..., K-1 from 0.
//    That depends only on (x row, w row, K) -- not on the tile shape, the row count, the
//    thread split or the ISA (AVX-512, AVX2 and the scalar fmadd fallback round alike) -- so
//    a token's numbers are the same in a 1-token decode and a 512-token chunk.
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <utility>

#include "cairn/kernels.h"
#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace cairn {

size_t packed_floats(int N, int K) { return (size_t)((N + kPanel - 1) / kPanel) * K * kPanel; }

template <class T, class Store>
static void pack_rows(const std::vector<const float*>& rows, int K, T* P, Store store) {
  const int np = (int)((rows.size() + kPanel - 1) / kPanel);
  for (int p = 0; p < np; ++p) {
    T* dst = P + (size_t)p * K * kPanel;  // [K][16]
    for (int l = 0; l < kPanel; ++l) {
      const size_t n = (size_t)p * kPanel + l;
      const float* src = n < rows.size() ? rows[n] : nullptr;
      for (int k = 0; k < K; ++k) dst[(size_t)k * kPanel + l] = store(src ? src[k] : 0.f);
    }
  }
}

void pack_panels(const std::vector<const float*>& rows, int K, float* P) {
  pack_rows(rows, K, P, [](float v) { return v; });
}

void pack_panels_bf16(const std::vector<const float*>& rows, int K, uint16_t* P) {
  pack_rows(rows, K, P, [](float v) {
    uint32_t b;
    std::memcpy(&b, &v, 4);
    return (uint16_t)(b >> 16);  // exact: the rows hold widened BF16 values
  });
}

void pack_panels_kn(const float* const* rows, int K, int N, float* P) {
  const int np = (N + kPanel - 1) / kPanel;
  for (int p = 0; p < np; ++p) {
    float* dst = P + (size_t)p * K * kPanel;
    const int n0 = p * kPanel, nn = std::min(kPanel, N - n0);
    for (int k = 0; k < K; ++k) {
      std::memcpy(dst + (size_t)k * kPanel, rows[k] + n0, sizeof(float) * nn);
      std::fill(dst + (size_t)k * kPanel + nn, dst + (size_t)(k + 1) * kPanel, 0.f);
    }
  }
}

// ---- quantized panels ----------------------------------------------------------------------
// Codes are copied as stored (an E4M3 byte per lane; E2M1 nibbles two lanes to a byte, the even
// lane low) and each lane gets its row's scale exponent per group of k. Widening yields the code's
// value times 2^-bias (E4M3 through the FP16 bit pattern: exact, subnormals included; E2M1 from a
// table of halves), so the lane scale is stored as exponent + bias: w = widened * 2^(e + bias - 127)
// = q * 2^(e - 127) exactly, in one multiply. That w is the dequantized weight, and the same FMA
// chain as fp32 panels follows -- the bits of the fp32 path on the dequantized weights.
// (qbias and qstride: kernels.h, where the packed file's layout description reads them too)

static size_t qpanels(int N) { return (size_t)((N + kPanel - 1) / kPanel); }
size_t qpanel_code_bytes(QFmt f, int N, int K) { return qpanels(N) * K * qstride(f); }
size_t qpanel_scale_bytes(QFmt f, int N, int K) {
  return qpanels(N) * ((K + qgroup(f) - 1) / qgroup(f)) * kPanel;
}

int qscale_max(QFmt f) { return 254 - qbias(f); }

void pack_panels_q(QFmt f, const std::vector<QRow>& rows, int K, uint8_t* codes, uint8_t* scales) {
  const int G = qgroup(f), ng = (K + G - 1) / G, st = qstride(f), b = qbias(f);
  const int np = (int)qpanels((int)rows.size());
  static const uint8_t zeros[1] = {0};
  for (int p = 0; p < np; ++p) {
    uint8_t* cd = codes + (size_t)p * K * st;
    uint8_t* sd = scales + (size_t)p * ng * kPanel;
    const uint8_t* src[kPanel];  // each lane's row of codes (a zero row: codes 0 = +0.0)
    for (int l = 0; l < kPanel; ++l) {
      const size_t n = (size_t)p * kPanel + l;
      const QRow q = n < rows.size() ? rows[n] : QRow{nullptr, 0};
      if (!q.src) {
        src[l] = nullptr;
        for (int g = 0; g < ng; ++g) sd[(size_t)g * kPanel + l] = 127;  // any valid scale
        continue;
      }
      const Linear& L = *q.src;
      const uint8_t* sc = f == QFmt::E4M3 ? L.qs + (size_t)(q.r / kFp8Block) * ng : L.qs + (size_t)q.r * ng;
      for (int g = 0; g < ng; ++g) sd[(size_t)g * kPanel + l] = (uint8_t)(sc[g] + b);
      src[l] = L.q + (size_t)q.r * (f == QFmt::E4M3 ? K : K / 2);
    }
    if (f == QFmt::E4M3) {
      for (int l = 0; l < kPanel; ++l) {
        if (!src[l]) {
          for (int k = 0; k < K; ++k) cd[(size_t)k * st + l] = 0;
          continue;
        }
        for (int k = 0; k < K; ++k) cd[(size_t)k * st + l] = src[l][k];
      }
    } else {
      // lanes 2j and 2j+1 share a byte; a source byte holds columns 2k' and 2k'+1
      for (int j = 0; j < kPanel / 2; ++j) {
        const uint8_t *a = src[2 * j], *c = src[2 * j + 1];
        const int sa = a ? 1 : 0, sb = c ? 1 : 0;  // stride 0 over a one-byte zero row
        if (!a) a = zeros;
        if (!c) c = zeros;
        for (int k2 = 0; k2 < K / 2; ++k2) {
          const uint8_t x = a[k2 * sa], y = c[k2 * sb];
          cd[(size_t)(2 * k2) * st + j] = (uint8_t)((x & 15) | (y << 4));
          cd[(size_t)(2 * k2 + 1) * st + j] = (uint8_t)((x >> 4) | (y & 0xF0));
        }
      }
    }
  }
}

// Scalar widening (value * 2^-bias), the reference for the vector paths.
static float e4m3_scaled(uint8_t c) {  // c's e4m3fn value * 2^-8
  const int e = (c >> 3) & 15, m = c & 7;
  const float v = e ? std::ldexp((float)(8 + m), e - 7 - 3) : std::ldexp((float)m, -9);
  return ((c & 0x80) ? -v : v) * (1.f / 256.f);
}
static const std::array<float, 256> kE4M3 = [] {
  std::array<float, 256> t{};
  for (int c = 0; c < 256; ++c) t[c] = e4m3_scaled((uint8_t)c);
  return t;
}();
// e2m1 magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 halved (bias 1); code 8 is +0.0 as in the official decoder
static constexpr float kE2M1[16] = {0.f,   .25f,  .5f,  .75f,  1.f,  1.5f,  2.f,  3.f,
                                    0.f, -.25f, -.5f, -.75f, -1.f, -1.5f, -2.f, -3.f};
static inline float qscale(uint8_t e) {
  const uint32_t b = (uint32_t)e << 23;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
template <QFmt F>
static inline float qcode(const uint8_t* p, int l) {  // lane l of the codes at one k
  if (F == QFmt::E4M3) return kE4M3[p[l]];
  return kE2M1[(p[l / 2] >> (4 * (l & 1))) & 15];
}

#if defined(__AVX512F__)
static inline __m512 load_panel(const float* p) { return _mm512_loadu_ps(p); }
static inline __m512 load_panel(const uint16_t* p) {  // 16 BF16 bit patterns -> fp32 (exact)
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
#endif

// r[i][j*16 + l] (+)= sum_{k < kc} x[i][k0 + k] * p[j*ps + k*16 + l] for i < MR, j < NP (p: the
// panels' row k0; fp32 panels, or BF16 ones widened in registers -- AVX-512 builds only).
// cont: continue the sums already in r (an exact fp32 partial, so splitting K into blocks does
// not change the chain of FMAs).
template <int MR, int NP, class T>
static void ptile(const float* const* x, int k0, int kc, const T* p, size_t ps, float* r, bool cont) {
#if defined(__AVX512F__)
  __m512 acc[MR][NP];
  const float* xr[MR];
  for (int i = 0; i < MR; ++i) {
    xr[i] = x[i] + k0;
    for (int j = 0; j < NP; ++j)
      acc[i][j] = cont ? _mm512_loadu_ps(r + (i * NP + j) * kPanel) : _mm512_setzero_ps();
  }
  for (int k = 0; k < kc; ++k) {
    __m512 b[NP];
    for (int j = 0; j < NP; ++j) b[j] = load_panel(p + j * ps + (size_t)k * kPanel);
    for (int i = 0; i < MR; ++i) {
      const __m512 a = _mm512_set1_ps(xr[i][k]);
      for (int j = 0; j < NP; ++j) acc[i][j] = _mm512_fmadd_ps(a, b[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NP; ++j) _mm512_storeu_ps(r + (i * NP + j) * kPanel, acc[i][j]);
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 acc[MR][2 * NP];
  const float* xr[MR];
  for (int i = 0; i < MR; ++i) {
    xr[i] = x[i] + k0;
    for (int j = 0; j < 2 * NP; ++j) acc[i][j] = cont ? _mm256_loadu_ps(r + i * NP * kPanel + j * 8) : _mm256_setzero_ps();
  }
  for (int k = 0; k < kc; ++k) {
    __m256 b[2 * NP];
    for (int j = 0; j < NP; ++j) {
      b[2 * j] = _mm256_loadu_ps(p + j * ps + (size_t)k * kPanel);
      b[2 * j + 1] = _mm256_loadu_ps(p + j * ps + (size_t)k * kPanel + 8);
    }
    for (int i = 0; i < MR; ++i) {
      const __m256 a = _mm256_set1_ps(xr[i][k]);
      for (int j = 0; j < 2 * NP; ++j) acc[i][j] = _mm256_fmadd_ps(a, b[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 2 * NP; ++j) _mm256_storeu_ps(r + i * NP * kPanel + j * 8, acc[i][j]);
#else
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NP; ++j)
      for (int l = 0; l < kPanel; ++l) {
        float a = cont ? r[(i * NP + j) * kPanel + l] : 0.f;
        for (int k = 0; k < kc; ++k) a = fmadd(x[i][k0 + k], p[j * ps + (size_t)k * kPanel + l], a);
        r[(i * NP + j) * kPanel + l] = a;
      }
#endif
}

template <class T>
using PTileFn = void (*)(const float* const*, int, int, const T*, size_t, float*, bool);
template <class T, int MR, int... NPs>
static constexpr std::array<PTileFn<T>, sizeof...(NPs)> ptile_row(std::integer_sequence<int, NPs...>) {
  return {&ptile<MR, NPs + 1, T>...};
}
template <class T, int... MRs>
static constexpr std::array<std::array<PTileFn<T>, kPackN>, sizeof...(MRs)> ptile_table(std::integer_sequence<int, MRs...>) {
  return {ptile_row<T, MRs + 1>(std::make_integer_sequence<int, kPackN>{})...};
}
// [mr-1][np-1]
static const auto kPTiles = ptile_table<float>(std::make_integer_sequence<int, kPackM>{});
#if defined(__AVX512F__)
static const auto kPTiles16 = ptile_table<uint16_t>(std::make_integer_sequence<int, kPackM>{});
#endif

// r (+)= x times quantized panels (the ptile contract), k0 a multiple of the scale group. p: the
// codes of panel 0 at row k0 (panel j at p + j*ps), s: its scales at group k0/G (panel j at s + j*ss).
template <int MR, int NP, QFmt F>
static void qtile(const float* const* x, int k0, int kc, const uint8_t* p, size_t ps, const uint8_t* s,
                  size_t ss, float* r, bool cont) {
  constexpr int G = qgroup(F), st = qstride(F);
#if defined(__AVX512F__)
  const __m512 lut = _mm512_loadu_ps(kE2M1);
  const __m256i sgnmask = _mm256_set1_epi16((short)0xBF80);
  __m512 acc[MR][NP];
  const float* xr[MR];
  for (int i = 0; i < MR; ++i) {
    xr[i] = x[i] + k0;
    for (int j = 0; j < NP; ++j)
      acc[i][j] = cont ? _mm512_loadu_ps(r + (i * NP + j) * kPanel) : _mm512_setzero_ps();
  }
  for (int g0 = 0; g0 < kc; g0 += G) {
    const int ge = std::min(kc, g0 + G);
    __m512 sv[NP];
    for (int j = 0; j < NP; ++j)
      sv[j] = _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(s + j * ss + (size_t)(g0 / G) * kPanel))), 23));
    for (int k = g0; k < ge; ++k) {
      __m512 b[NP];
      for (int j = 0; j < NP; ++j) {
        const uint8_t* c = p + j * ps + (size_t)k * st;
        __m512 v;
        if (F == QFmt::E4M3) {  // sign-extended byte << 7, bit 14 cleared: the FP16 pattern of q * 2^-8
          const __m256i h = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)c));
          v = _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(h, 7), sgnmask));
        } else {  // byte j and byte j >> 4 interleaved: the table index is the low nibble
          const __m128i q = _mm_loadl_epi64((const __m128i*)c);
          v = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(q, _mm_srli_epi16(q, 4))), lut);
        }
        b[j] = _mm512_mul_ps(v, sv[j]);
      }
      for (int i = 0; i < MR; ++i) {
        const __m512 a = _mm512_set1_ps(xr[i][k]);
        for (int j = 0; j < NP; ++j) acc[i][j] = _mm512_fmadd_ps(a, b[j], acc[i][j]);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NP; ++j) _mm512_storeu_ps(r + (i * NP + j) * kPanel, acc[i][j]);
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  const __m256 lut = _mm256_loadu_ps(kE2M1);  // the 8 magnitudes; bit 3 of the code is the sign
  const __m128i sgnmask = _mm_set1_epi16((short)0xBF80);
  const __m256i sign = _mm256_set1_epi32((int)0x80000000u);
  __m256 acc[MR][2 * NP];
  const float* xr[MR];
  for (int i = 0; i < MR; ++i) {
    xr[i] = x[i] + k0;
    for (int j = 0; j < 2 * NP; ++j) acc[i][j] = cont ? _mm256_loadu_ps(r + i * NP * kPanel + j * 8) : _mm256_setzero_ps();
  }
  for (int g0 = 0; g0 < kc; g0 += G) {
    const int ge = std::min(kc, g0 + G);
    __m256 sv[2 * NP];
    for (int j = 0; j < NP; ++j) {
      const __m128i e = _mm_loadu_si128((const __m128i*)(s + j * ss + (size_t)(g0 / G) * kPanel));
      sv[2 * j] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu8_epi32(e), 23));
      sv[2 * j + 1] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(e, 8)), 23));
    }
    for (int k = g0; k < ge; ++k) {
      __m256 b[2 * NP];
      for (int j = 0; j < NP; ++j) {
        const uint8_t* c = p + j * ps + (size_t)k * st;
        for (int h = 0; h < 2; ++h) {
          __m256 v;
          if (F == QFmt::E4M3) {
            const __m128i w = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i*)(c + 8 * h)));
            v = _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(w, 7), sgnmask));
          } else {
            int32_t u;
            std::memcpy(&u, c + 4 * h, 4);
            const __m128i q = _mm_cvtsi32_si128(u);
            const __m256i idx = _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(q, _mm_srli_epi16(q, 4)));
            const __m256 mag = _mm256_permutevar8x32_ps(lut, idx);  // low 3 bits index
            v = _mm256_xor_ps(mag, _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(idx, 28), sign)));
          }
          b[2 * j + h] = _mm256_mul_ps(v, sv[2 * j + h]);
        }
      }
      for (int i = 0; i < MR; ++i) {
        const __m256 a = _mm256_set1_ps(xr[i][k]);
        for (int j = 0; j < 2 * NP; ++j) acc[i][j] = _mm256_fmadd_ps(a, b[j], acc[i][j]);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 2 * NP; ++j) _mm256_storeu_ps(r + i * NP * kPanel + j * 8, acc[i][j]);
#else
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NP; ++j)
      for (int l = 0; l < kPanel; ++l) {
        float a = cont ? r[(i * NP + j) * kPanel + l] : 0.f;
        for (int k = 0; k < kc; ++k) {
          const float w = qcode<F>(p + j * ps + (size_t)k * st, l) * qscale(s[j * ss + (size_t)(k / G) * kPanel + l]);
          a = fmadd(x[i][k0 + k], w, a);
        }
        r[(i * NP + j) * kPanel + l] = a;
      }
#endif
}

using QTileFn = void (*)(const float* const*, int, int, const uint8_t*, size_t, const uint8_t*, size_t, float*, bool);
template <QFmt F, int MR, int... NPs>
static constexpr std::array<QTileFn, sizeof...(NPs)> qtile_row(std::integer_sequence<int, NPs...>) {
  return {&qtile<MR, NPs + 1, F>...};
}
template <QFmt F, int... MRs>
static constexpr std::array<std::array<QTileFn, kPackN>, sizeof...(MRs)> qtile_table(std::integer_sequence<int, MRs...>) {
  return {qtile_row<F, MRs + 1>(std::make_integer_sequence<int, kPackN>{})...};
}
static const auto kQTiles8 = qtile_table<QFmt::E4M3>(std::make_integer_sequence<int, kPackM>{});
static const auto kQTiles4 = qtile_table<QFmt::E2M1>(std::make_integer_sequence<int, kPackM>{});

// K is walked in blocks of kKC: every row tile re-reads the np panels' block (np x kKC x 64 B,
// 128 KB) from L2, half of what one pass over K = 1024 would stream; partial sums wait in out.
static constexpr int kKC = 512;

static_assert(kKC % kFp8Block == 0 && kKC % kFp4Group == 0, "K blocks start on scale groups");

static void packed_panels_q(const float* const* x, int M, const Linear& L, int p0, int np, float* out) {
  const int K = L.in, ld = np * kPanel, G = qgroup(L.qf), ng = (K + G - 1) / G;
  const size_t ps = (size_t)K * qstride(L.qf), ss = (size_t)ng * kPanel;
  const auto& tiles = L.qf == QFmt::E4M3 ? kQTiles8 : kQTiles4;
  for (int k0 = 0; k0 < K; k0 += kKC) {
    const int kc = std::min(kKC, K - k0);
    const uint8_t* c = L.pq + p0 * ps + (size_t)k0 * qstride(L.qf);
    const uint8_t* s = L.pqs + p0 * ss + (size_t)(k0 / G) * kPanel;
    for (int a = 0; a < M; a += kPackM) {
      const int mr = std::min(kPackM, M - a);
      tiles[mr - 1][np - 1](x + a, k0, kc, c, ps, s, ss, out + (size_t)a * ld, k0 > 0);
    }
  }
}

void packed_panels(const float* const* x, int M, const Linear& L, int p0, int np, float* out) {
  if (L.pq) return packed_panels_q(x, M, L, p0, np, out);
  const int K = L.in, ld = np * kPanel;
  const size_t ps = (size_t)K * kPanel, off = p0 * ps;
  for (int k0 = 0; k0 < K; k0 += kKC) {
    const int kc = std::min(kKC, K - k0);
    for (int a = 0; a < M; a += kPackM) {
      const int mr = std::min(kPackM, M - a);
      float* r = out + (size_t)a * ld;
#if defined(__AVX512F__)
      if (L.p16) {
        kPTiles16[mr - 1][np - 1](x + a, k0, kc, L.p16 + off + (size_t)k0 * kPanel, ps, r, k0 > 0);
        continue;
      }
#endif
      kPTiles[mr - 1][np - 1](x + a, k0, kc, L.p + off + (size_t)k0 * kPanel, ps, r, k0 > 0);
    }
  }
}

// Rows [a0, a1) x panels [p0, p1) of Y = X W^T.
static void packed_block(const float* const* x, int a0, int a1, const Linear& L, int p0, int p1, float* Y,
                         int ldy, std::vector<float>& buf) {
  buf.resize((size_t)(a1 - a0) * kPackN * kPanel);
  for (int p = p0; p < p1; p += kPackN) {
    const int np = std::min(kPackN, p1 - p);
    const int c0 = p * kPanel, nc = std::min(L.out, (p + np) * kPanel) - c0;
    packed_panels(x + a0, a1 - a0, L, p, np, buf.data());
    for (int i = a0; i < a1; ++i)
      std::memcpy(Y + (size_t)i * ldy + c0, &buf[(size_t)(i - a0) * np * kPanel], sizeof(float) * nc);
  }
}

void linear_rows(const float* const* x, int M, const Linear& L, float* Y, int ldy) {
  thread_local std::vector<float> buf;  // called per query / token block: no allocation per call
  packed_block(x, 0, M, L, 0, (L.out + kPanel - 1) / kPanel, Y, ldy, buf);
}

void linear(const float* X, int M, int ldx, const Linear& L, float* Y, int ldy, int threads) {
  if (M <= 0) return;
  std::vector<const float*> x(M);
  for (int i = 0; i < M; ++i) x[i] = X + (size_t)i * ldx;
  const int npan = (L.out + kPanel - 1) / kPanel;
  const int ncg = (npan + kPackN - 1) / kPackN;  // column groups
  // Tasks take all rows of a column group (its weights are read from memory once), and rows
  // are split only when there are too few column groups to keep every thread busy.
  const int T = std::max(1, threads);
  const int nrb = std::min((M + kPackM - 1) / kPackM, std::max(1, (4 * T + ncg - 1) / ncg));
  const int rb = ((M + nrb - 1) / nrb + kPackM - 1) / kPackM * kPackM;  // rows per task
  const int64_t work = (int64_t)M * L.out * L.in;
#pragma omp parallel for num_threads(T) schedule(dynamic, 1) if (T > 1 && work > kParMinWork)
  for (int t = 0; t < ncg * nrb; ++t) {
    const int g = t % ncg, b = t / ncg;
    if (b * rb >= M) continue;
    thread_local std::vector<float> buf;
    packed_block(x.data(), b * rb, std::min(M, (b + 1) * rb), L, g * kPackN, std::min(npan, (g + 1) * kPackN),
                 Y, ldy, buf);
  }
}

}  // namespace cairn
