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

// K is walked in blocks of kKC: every row tile re-reads the np panels' block (np x kKC x 64 B,
// 128 KB) from L2, half of what one pass over K = 1024 would stream; partial sums wait in out.
static constexpr int kKC = 512;

void packed_panels(const float* const* x, int M, const Linear& L, int p0, int np, float* out) {
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
