// cairn kernel: low-level numeric helpers (packed GEMM, dot, exp, norms, RoPE).
#pragma once
#include <cstdint>
#include <vector>

#include "cairn/model.h"

namespace cairn {

// Parallel regions are only opened for at least this many multiply-adds: below it the fork/join
// (and, on an oversubscribed machine, waiting for a descheduled thread) costs more than it saves.
constexpr int64_t kParMinWork = 1 << 17;

// Packed weights (packed.cpp): panels of kPanel output rows, k-major; micro-tiles of up to
// kPackM input rows x kPackN panels. Each output = fma chain over k ascending from 0, so it
// depends only on (x row, w row, K).
constexpr int kPanel = 16;
// BF16 matrices stay BF16 panels (formats/bf16.cpp: widened a span at a time, half the bytes).
constexpr bool kBf16Panels = true;
#if defined(__AVX512F__)
constexpr int kPackM = 6, kPackN = 4;  // 24 zmm accumulators + 4 panel vectors + 1 broadcast
#elif defined(__AVX2__)
// 12 ymm accumulators (3 rows x 2 panels x 2 halves), 2 panel halves and a broadcast in 16 registers.
// 2 rows left a quarter of the registers idle: the V4-Flash slice's prefill on this path ran at
// 0.75-0.85x of 3 rows; 4 rows spill (0.55-0.7x).
constexpr int kPackM = 3, kPackN = 2;
#else
constexpr int kPackM = 2, kPackN = 2;
#endif
size_t packed_floats(int N, int K);
// rows: logical rows of the matrix (nullptr = zero row), K floats each -> P (packed_floats)
void pack_panels(const std::vector<const float*>& rows, int K, float* P);
// The same panels as BF16 bit patterns; the rows must hold BF16-representable values
// (formats/bf16.cpp).
void pack_panels_bf16(const std::vector<const uint16_t*>& rows, int K, uint16_t* P);
// Quantized panels (QFmt, formats/): one logical row is (source matrix with q/qs set, row
// index), or a zero row when src is null.
struct QRow {
  const Linear* src;
  int r;
};
// Stored lane scale = ue8m0 exponent + qbias (the widened code carries 2^-qbias); code bytes per k.
constexpr int qbias(QFmt f) { return f == QFmt::E2M1 ? 1 : 8; }
constexpr int qstride(QFmt f) { return f == QFmt::E2M1 ? kPanel / 2 : kPanel; }
// Largest ue8m0 scale byte a format's panels can hold (the loader refuses larger ones).
int qscale_max(QFmt f);
// rows: K rows of N floats (a [K, N] matrix) -> the panels of its transpose (W[N, K] = rows^T)
void pack_panels_kn(const float* const* rows, int K, int N, float* P);
// out[M][np*16] = rows x[0..M) times L's panels [p0, p0 + np) (np <= kPackN), of any format;
// K in blocks (the same sums as one pass). xb: bounds of rows including these, made once for many
// calls (formats/pow2_chain.h); without them a call makes its own.
struct Pow2Rows;
void packed_panels(const float* const* x, int M, const Linear& L, int p0, int np, float* out,
                   const Pow2Rows* xb = nullptr);
// Y[M, out] (ldy) = X[M, in] (ldx) W^T through L's packed panels, tasks split over threads.
void linear(const float* X, int M, int ldx, const Linear& L, float* Y, int ldy, int threads);
// Y[M, out] (ldy) = rows x[0..M) times W^T, on the calling thread (for use inside parallel regions).
void linear_rows(const float* const* x, int M, const Linear& L, float* Y, int ldy);
inline void linear(const float* X, int M, const Linear& L, float* Y, int threads) {
  linear(X, M, L.in, L, Y, L.out, threads);
}
// a*b + c rounded once where the target has fused multiply-adds (x86 FMA3, every aarch64) -- the
// rounding of the vector paths, so scalar tails and reference loops match their lanes bit for bit,
// and builds for different CPUs give the same bits. A target without them (x86-64-v2) has no fused
// paths to match and uses a multiply and an add (std::fma would be a slow library call there).
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define CAIRN_HAS_FMA 1
#else
#define CAIRN_HAS_FMA 0
#endif
inline float fmadd(float a, float b, float c) {
#if CAIRN_HAS_FMA
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}
float dot(const float* a, const float* b, int n);
// y[i] = exp(x[i]) (in place allowed), ~1-2 ulp; fexp is the same function for one value.
void vexp(const float* x, float* y, int n);
float fexp(float x);
void axpy(float a, const float* x, float* y, int n);  // y += a*x
// y = w * x * rsqrt(mean(x^2) + eps)  (w may be null => unweighted). In-place allowed.
void rmsnorm(const float* x, const float* w, float* y, int n, float eps);
// Interleaved RoPE on the last r channels of x[dim] at position pos. sign = -1 undoes it.
void rope(float* x, int dim, int r, const float* inv_freq, int64_t pos, float sign = 1.f);
void rope_cs(int64_t pos, int half, const float* inv_freq, float* cos, float* sin);
void rope_apply(float* x, int dim, int r, const float* cos, const float* sin, float sign);

}  // namespace cairn
