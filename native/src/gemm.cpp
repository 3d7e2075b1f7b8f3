// cairn kernel: small vector helpers (dot, axpy, exp, RMSNorm, RoPE). The matrix products
// live in packed.cpp.
//
// Design notes
//  * Every reduction has a fixed order that depends only on its length, so results are
//    reproducible across calls and chunkings.
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include "cairn/kernels.h"
#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace cairn {

// 32 partial sums (lane j takes elements j, j+32, ...; a tail of whole 8s goes to lanes 0-7), added
// pairwise, then the last n % 8 products in order: the order of four AVX2 accumulators and their
// horizontal sum, written in portable code so that every target -- AVX2, AVX-512, NEON, SSE --
// adds in this order (fp32 adds do not associate; no compiler reorders them without -ffast-math).
// Whether the compiler vectorizes the lanes changes nothing.
float dot(const float* a, const float* b, int n) {
  float acc[32] = {};
  int i = 0;
  for (; i + 32 <= n; i += 32)
    for (int j = 0; j < 32; ++j) acc[j] = fmadd(a[i + j], b[i + j], acc[j]);
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] = fmadd(a[i + j], b[i + j], acc[j]);
  float t[8];
  for (int j = 0; j < 8; ++j) t[j] = (acc[j] + acc[8 + j]) + (acc[16 + j] + acc[24 + j]);
  float s = ((t[0] + t[4]) + (t[1] + t[5])) + ((t[2] + t[6]) + (t[3] + t[7]));
  for (; i < n; ++i) s = fmadd(a[i], b[i], s);
  return s;
}

void axpy(float a, const float* x, float* y, int n) {
  int i = 0;
#ifdef __AVX2__
  __m256 va = _mm256_set1_ps(a);
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
  for (; i < n; ++i) y[i] = fmadd(a, x[i], y[i]);  // the vector lanes' rounding, not left to contraction
}

// ---- vectorised exp ----------------------------------------------------------------------
// Cephes-style: n = round(x log2 e), r = x - n ln2 (two-part), degree-6 polynomial, times 2^n.
// About 1-2 ulp. The scalar version performs the same fp32 operations as each vector lane, so
// a value's exp does not depend on whether it falls in a vector or in the tail.
namespace {
constexpr float kExpHi = 88.3762626647949f, kExpLo = -88.3762626647949f, kLog2e = 1.44269504088896341f;
constexpr float kC1 = 0.693359375f, kC2 = -2.12194440e-4f;
constexpr float kP0 = 1.9875691500E-4f, kP1 = 1.3981999507E-3f, kP2 = 8.3334519073E-3f,
                kP3 = 4.1665795894E-2f, kP4 = 1.6666665459E-1f, kP5 = 5.0000001201E-1f;
inline float exp_scalar(float x) {
  x = std::min(std::max(x, kExpLo), kExpHi);
  const float n = std::nearbyint(x * kLog2e);
  float r = fmadd(n, -kC1, x);
  r = fmadd(n, -kC2, r);
  float p = kP0;
  p = fmadd(p, r, kP1); p = fmadd(p, r, kP2); p = fmadd(p, r, kP3);
  p = fmadd(p, r, kP4); p = fmadd(p, r, kP5);
  const float y = fmadd(p, r * r, r) + 1.f;
  return std::ldexp(y, (int)n);
}
#if defined(__AVX512F__)
inline __m512 exp512(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kExpLo)), _mm512_set1_ps(kExpHi));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kC1), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kC2), r);
  __m512 p = _mm512_set1_ps(kP0);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP1)); p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP3)); p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP5));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(y, n);
}
#elif defined(__AVX2__) && defined(__FMA__)
inline __m256 pow2_256(__m256i e) {  // 2^e for e in [-126, 127]
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
}
inline __m256 exp256(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kExpLo)), _mm256_set1_ps(kExpHi));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kC1), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kC2), r);
  __m256 p = _mm256_set1_ps(kP0);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP1)); p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP3)); p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP5));
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.f));
  // y * 2^n as ldexp: n is in [-128, 128], so in two powers of at most 2^64 each; y * 2^(n>>1) is
  // exact (normal), and only the second product can round (a subnormal result), once, as ldexp does
  const __m256i ni = _mm256_cvtps_epi32(n), n1 = _mm256_srai_epi32(ni, 1);
  return _mm256_mul_ps(_mm256_mul_ps(y, pow2_256(n1)), pow2_256(_mm256_sub_epi32(ni, n1)));
}
#endif
}  // namespace

void vexp(const float* x, float* y, int n) {
  int i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, exp512(_mm512_loadu_ps(x + i)));
#elif defined(__AVX2__) && defined(__FMA__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp256(_mm256_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) y[i] = exp_scalar(x[i]);
}

float fexp(float x) { return exp_scalar(x); }

void rmsnorm(const float* x, const float* w, float* y, int n, float eps) {
  // 32-lane fp32 accumulation (as torch's vectorised reduction: no long serial chain), the same
  // order on every target (dot)
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
