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

// dst[i] = the fp32 value of BF16 bits src[i] (exact)
static void widen_bf16(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(src + i)));
    _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
  }
#endif
  for (; i < n; ++i) {
    const uint32_t b = (uint32_t)src[i] << 16;
    std::memcpy(dst + i, &b, 4);
  }
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

// r[i][j*16 + l] (+)= sum_{k < kc} x[i][k0 + k] * p[j*ps + k*16 + l] for i < MR, j < NP (p: the
// panels' row k0). cont: continue the sums already in r (an exact fp32 partial, so splitting K
// into blocks does not change the chain of FMAs).
template <int MR, int NP>
static void ptile(const float* const* x, int k0, int kc, const float* p, size_t ps, float* r, bool cont) {
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
    for (int j = 0; j < NP; ++j) b[j] = _mm512_loadu_ps(p + j * ps + (size_t)k * kPanel);
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

using PTileFn = void (*)(const float* const*, int, int, const float*, size_t, float*, bool);
template <int MR, int... NPs>
static constexpr std::array<PTileFn, sizeof...(NPs)> ptile_row(std::integer_sequence<int, NPs...>) {
  return {&ptile<MR, NPs + 1>...};
}
template <int... MRs>
static constexpr std::array<std::array<PTileFn, kPackN>, sizeof...(MRs)> ptile_table(std::integer_sequence<int, MRs...>) {
  return {ptile_row<MRs + 1>(std::make_integer_sequence<int, kPackN>{})...};
}
static const auto kPTiles = ptile_table(std::make_integer_sequence<int, kPackM>{});  // [mr-1][np-1]

void packed_tile(int mr, int np, const float* const* x, const float* p, int K, float* r) {
  kPTiles[mr - 1][np - 1](x, 0, K, p, (size_t)K * kPanel, r, false);
}

#if defined(__AVX512F__)
// Few rows (decode): BF16 panels widened in registers, no buffer -- the product is bound by
// reading the weights, and reading half the bytes is the point. Same FMA chain as ptile.
template <int MR, int NP>
static void ptile16(const float* const* x, int k0, int kc, const uint16_t* p, size_t ps, float* r, bool cont) {
  __m512 acc[MR][NP];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NP; ++j)
      acc[i][j] = cont ? _mm512_loadu_ps(r + (i * NP + j) * kPanel) : _mm512_setzero_ps();
  for (int k = 0; k < kc; ++k) {
    __m512 b[NP];
    for (int j = 0; j < NP; ++j)
      b[j] = _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(p + j * ps + (size_t)k * kPanel))), 16));
    for (int i = 0; i < MR; ++i) {
      const __m512 a = _mm512_set1_ps(x[i][k0 + k]);
      for (int j = 0; j < NP; ++j) acc[i][j] = _mm512_fmadd_ps(a, b[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NP; ++j) _mm512_storeu_ps(r + (i * NP + j) * kPanel, acc[i][j]);
}
using PTile16Fn = void (*)(const float* const*, int, int, const uint16_t*, size_t, float*, bool);
static constexpr int kDirectM = 2;  // rows up to which BF16 panels are read directly
static const PTile16Fn kPTiles16[kDirectM][kPackN] = {
    {&ptile16<1, 1>, &ptile16<1, 2>, &ptile16<1, 3>, &ptile16<1, 4>},
    {&ptile16<2, 1>, &ptile16<2, 2>, &ptile16<2, 3>, &ptile16<2, 4>}};
static_assert(kPackN == 4, "kPTiles16 lists np = 1..4");
#endif

// K is walked in blocks of kKC: every row tile re-reads the np panels' block (np x kKC x 64 B,
// 128 KB) from L2, half of what one pass over K = 1024 would stream; partial sums wait in out.
// BF16 panels are widened block by block into a buffer first (exact), so the weights stream
// from memory at half the bytes and the tiles are the fp32 ones.
static constexpr int kKC = 512;

void packed_panels(const float* const* x, int M, const Linear& L, int p0, int np, float* out) {
  const int K = L.in, ld = np * kPanel;
  const size_t ps = (size_t)K * kPanel;
  thread_local std::vector<float> wide;  // [np][kKC][16]
#if defined(__AVX512F__)
  if (!L.p && M <= kDirectM) {
    for (int k0 = 0; k0 < K; k0 += kKC)
      kPTiles16[M - 1][np - 1](x, k0, std::min(kKC, K - k0), L.p16 + p0 * ps + (size_t)k0 * kPanel, ps, out, k0 > 0);
    return;
  }
#endif
  for (int k0 = 0; k0 < K; k0 += kKC) {
    const int kc = std::min(kKC, K - k0);
    const float* p = L.p ? L.p + p0 * ps + (size_t)k0 * kPanel : nullptr;
    size_t pstride = ps;
    if (!L.p) {
      wide.resize((size_t)np * kc * kPanel);
      for (int j = 0; j < np; ++j)
        widen_bf16(L.p16 + (p0 + j) * ps + (size_t)k0 * kPanel, &wide[(size_t)j * kc * kPanel], (size_t)kc * kPanel);
      p = wide.data();
      pstride = (size_t)kc * kPanel;
    }
    for (int a = 0; a < M; a += kPackM) {
      const int mr = std::min(kPackM, M - a);
      kPTiles[mr - 1][np - 1](x + a, k0, kc, p, pstride, out + (size_t)a * ld, k0 > 0);
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
