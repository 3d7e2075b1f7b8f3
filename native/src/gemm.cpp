// cairn kernel: GEMM / GEMV and small vector helpers.
//
// Design notes
//  * Threading choice: OpenMP is the only pool. OpenBLAS runs single-threaded (set at module
//    import) and we split the N (output-feature) dimension of every GEMM into one contiguous
//    slice per OpenMP thread, each slice a separate sgemm call. Two pools on 2 cores fight
//    (see docs/stack-notes.md), so OpenBLAS's own threads are never used.
//  * M == 1 (decode, chunk 1) uses a hand-written AVX2/FMA GEMV (memory-bound; rows are
//    streamed with 4 independent accumulators and software prefetch), portable fallback when
//    the build lacks AVX2 (CAIRN_PORTABLE=ON).
//  * Every reduction has a fixed order that depends only on its length, so results are
//    reproducible across calls and chunkings that issue the same shapes.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "cairn/kernels.h"
#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace cairn {

#ifdef __AVX2__
static inline float hsum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 sh = _mm_movehdup_ps(lo);
  __m128 s = _mm_add_ps(lo, sh);
  sh = _mm_movehl_ps(sh, s);
  s = _mm_add_ss(s, sh);
  return _mm_cvtss_f32(s);
}
#endif

float dot(const float* a, const float* b, int n) {
  int i = 0;
  float s = 0.f;
#ifdef __AVX2__
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
         a3 = _mm256_setzero_ps();
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), a3);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
  s = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
#endif
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy(float a, const float* x, float* y, int n) {
  int i = 0;
#ifdef __AVX2__
  __m256 va = _mm256_set1_ps(a);
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
  for (; i < n; ++i) y[i] += a * x[i];
}

// y[N] = W[N,K] x[K], rows [n0, n1)
static void gemv_rows(const float* x, int K, const float* W, int n0, int n1, float* y) {
  for (int j = n0; j < n1; ++j) {
#ifdef __AVX2__
    if (j + 2 < n1) _mm_prefetch((const char*)(W + (int64_t)(j + 2) * K), _MM_HINT_T0);
#endif
    y[j] = dot(W + (int64_t)j * K, x, K);
  }
}

void matmul(const float* X, int M, int K, int ldx, const float* W, int N, float* Y, int ldy,
            int threads) {
  if (M <= 0 || N <= 0) return;
  int T = std::max(1, threads);
  if (M == 1) {
    if (T == 1 || (int64_t)N * K < kParMinWork) {
      gemv_rows(X, K, W, 0, N, Y);
      return;
    }
#pragma omp parallel num_threads(T)
    {
      int t = omp_get_thread_num(), nt = omp_get_num_threads();
      int per = (N + nt - 1) / nt;
      int n0 = std::min(N, t * per), n1 = std::min(N, n0 + per);
      gemv_rows(X, K, W, n0, n1, Y);
    }
    return;
  }
  if (T == 1 || (int64_t)M * N * K < 2 * kParMinWork) {
    scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.f, X, ldx, W, K, 0.f, Y, ldy);
    return;
  }
#pragma omp parallel num_threads(T)
  {
    int t = omp_get_thread_num(), nt = omp_get_num_threads();
    int per = ((N + nt - 1) / nt + 15) / 16 * 16;
    int n0 = std::min(N, t * per), n1 = std::min(N, n0 + per);
    if (n1 > n0)
      scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, n1 - n0, K, 1.f, X, ldx,
                  W + (int64_t)n0 * K, K, 0.f, Y + n0, ldy);
  }
}

void rmsnorm(const float* x, const float* w, float* y, int n, float eps) {
  // 32-lane fp32 accumulation (as torch's vectorised reduction: no long serial chain)
  float var = dot(x, x, n) / (float)n;
  float rs = 1.f / std::sqrt(var + eps);
  if (w)
    for (int i = 0; i < n; ++i) y[i] = w[i] * (x[i] * rs);
  else
    for (int i = 0; i < n; ++i) y[i] = x[i] * rs;
}

void rope_cs(int64_t pos, int half, const float* inv_freq, float* c, float* s) {
  for (int i = 0; i < half; ++i) {
    float ang = (float)pos * inv_freq[i];  // fp32 angle, as HF
    c[i] = (float)std::cos((double)ang);
    s[i] = (float)std::sin((double)ang);
  }
}

void rope_apply(float* x, int dim, int r, const float* c, const float* s, float sign) {
  float* p = x + dim - r;
  for (int i = 0; i < r / 2; ++i) {
    float x0 = p[2 * i], x1 = p[2 * i + 1];
    float si = sign * s[i];
    p[2 * i] = x0 * c[i] + (-x1) * si;
    p[2 * i + 1] = x1 * c[i] + x0 * si;
  }
}

void rope(float* x, int dim, int r, const float* inv_freq, int64_t pos, float sign) {
  float c[256], s[256];
  rope_cs(pos, r / 2, inv_freq, c, s);
  rope_apply(x, dim, r, c, s, sign);
}

}  // namespace cairn
