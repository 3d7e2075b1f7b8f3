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
//    thread split or the ISA (AVX-512, AVX2 and the vector-type fallback round alike where the
//    target has FMA) -- so a token's numbers are the same in a 1-token decode and a 512-token chunk.
//  * Stored formats (formats/): the micro-kernel takes the weights through a widening functor, so
//    it is written once for fp32 panels and every codec.
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "cairn/kernels.h"
#include "formats/formats.h"
#include "formats/ggml_widen.h"
#include "formats/pow2_chain.h"
#include "formats/widen.h"
#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace cairn {

Pow2Stats g_pow2;

bool pow2_format(const Linear& L) {
  return !L.p && !L.p16 &&
         (L.qf == QFmt::E4M3 || L.qf == QFmt::E2M1 || (L.qf == QFmt::Ggml && L.codec && L.codec->ggml_type == kq::MXFP4::kType));
}

size_t packed_floats(int N, int K) { return (size_t)((N + kPanel - 1) / kPanel) * K * kPanel; }

void pack_panels(const std::vector<const float*>& rows, int K, float* P) {
  const int np = (int)((rows.size() + kPanel - 1) / kPanel);
  for (int p = 0; p < np; ++p) {
    float* dst = P + (size_t)p * K * kPanel;  // [K][16]
    for (int l = 0; l < kPanel; ++l) {
      const size_t n = (size_t)p * kPanel + l;
      const float* src = n < rows.size() ? rows[n] : nullptr;
      for (int k = 0; k < K; ++k) dst[(size_t)k * kPanel + l] = src ? src[k] : 0.f;
    }
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

// f(k, b) for k = 0, 1, ..., kc - 1 in order, b[j] = the 16 weights of panel j at column k. A W
// with groups (formats/ggml_widen.h: a run of a GGUF block's columns) is walked a group at a time,
// its per-group state (code pointers, scale vectors) set up once per group, and each of a group's
// kParts equal parts (a sub-block: one scale, one bit field) by its own loop, so what differs
// between parts (a shift count, which scale) is a constant in it. The columns, and so the FMA
// chain, are the same.
template <class W, class = void>
struct has_groups : std::false_type {};
template <class W>
struct has_groups<W, std::void_t<typename W::Group>> : std::true_type {};
// The part interface (codecs/format.h): kq::part_of<P>(g) is the object whose at<P> gives part P's
// columns; a part whose codes are words (codecs/codec.h, lane_byte) gives its columns in fours,
// at<P, S>(l) for column l + S of a word's four, so S's shift is a constant and the word one load.
using kq::has_words;
using kq::part_of;
template <int NP, int P, int S, class Q, class F>
__attribute__((always_inline)) inline void word_column(const Q* q, int k, int l, F& f) {
  lanes::f32x16 b[NP];
  for (int j = 0; j < NP; ++j) b[j] = q[j].template at<P, S>(l);
  f(k + l + S, b);
}
template <int NP, int P, class Q, class F, int... S>
__attribute__((always_inline)) inline void word_columns(const Q* q, int k, int l, F& f, std::integer_sequence<int, S...>) {
  (word_column<NP, P, S>(q, k, l, f), ...);
}
template <int NP, int P, class G, class F>
__attribute__((always_inline)) inline void group_part(const G* g, int k, int len, F& f) {
  using Q = decltype(part_of<P>(g[0]));
  Q q[NP];
  for (int j = 0; j < NP; ++j) q[j] = part_of<P>(g[j]);
  if constexpr (has_words<Q>::value) {
    for (int l = 0; l < len; l += Q::kWordCols)
      word_columns<NP, P>(q, k, l, f, std::make_integer_sequence<int, Q::kWordCols>{});
  } else {
    for (int l = 0; l < len; ++l) {
      lanes::f32x16 b[NP];
      for (int j = 0; j < NP; ++j) b[j] = q[j].template at<P>(l);
      f(k + l, b);
    }
  }
}
template <int NP, class G, class F, int... P>
__attribute__((always_inline)) inline void group_parts(const G* g, int k, int len, F& f, std::integer_sequence<int, P...>) {
  (group_part<NP, P>(g, k + P * len, len, f), ...);
}
template <int NP, class W, class F>
__attribute__((always_inline)) inline void columns_in(const W& w, int kb, int ke, F& f) {
  if constexpr (has_groups<W>::value) {
    for (int k = kb; k < ke; k += W::kGroup) {
      typename W::Group g[NP];
      for (int j = 0; j < NP; ++j) g[j] = w.group(j, k);
      group_parts<NP>(g, k, W::kGroup / W::kParts, f, std::make_integer_sequence<int, W::kParts>{});
    }
  } else {
    for (int k = kb; k < ke; ++k) {
      lanes::f32x16 b[NP];
      for (int j = 0; j < NP; ++j) b[j] = w(j, k);
      f(k, b);
    }
  }
}
// A W with kScaleCols gives codes whose weights are code * 2^s per lane and block of kScaleCols
// columns (formats/pow2_chain.h): before each block rescale(m) multiplies the accumulators by
// m[j] = w.rescale(j, k) (2^(s_prev - s)), and after the span by w.unscale(j) (2^s_last).
template <class W, class = void>
struct has_pow2 : std::false_type {};
template <class W>
struct has_pow2<W, std::void_t<decltype(W::kScaleCols)>> : std::true_type {};
template <int NP, class W, class F, class R>
__attribute__((always_inline)) inline void columns(const W& w, int kc, F&& f, R&& rescale) {
  if constexpr (has_pow2<W>::value) {
    lanes::f32x16 m[NP];
    for (int k = 0; k < kc; k += W::kScaleCols) {
      for (int j = 0; j < NP; ++j) m[j] = w.rescale(j, k);
      rescale(m);
      columns_in<NP>(w, k, std::min(kc, k + W::kScaleCols), f);
    }
    for (int j = 0; j < NP; ++j) m[j] = w.unscale(j);
    rescale(m);
  } else {
    columns_in<NP>(w, 0, kc, f);
  }
}

// r[i][j*16 + l] (+)= sum_{k < kc} x[i][k0 + k] * w(j, k)[l] for i < MR, j < NP, where w gives
// the 16 weights of panel j at the span's column k: loaded from fp32 panels or a codec's tile, or
// widened in registers by a codec (formats/). cont: continue the sums already in r (an exact fp32
// partial, so splitting K into blocks does not change the chain of FMAs).
template <int MR, int NP, class W>
static void ptile(const float* const* x, int k0, int kc, const W& w, float* r, bool cont) {
#if defined(__AVX512F__)
  __m512 acc[MR][NP];
  const float* xr[MR];
  for (int i = 0; i < MR; ++i) {
    xr[i] = x[i] + k0;
    for (int j = 0; j < NP; ++j)
      acc[i][j] = cont ? _mm512_loadu_ps(r + (i * NP + j) * kPanel) : _mm512_setzero_ps();
  }
  columns<NP>(w, kc, [&](int k, const lanes::f32x16* b) __attribute__((always_inline)) {
    for (int i = 0; i < MR; ++i) {
      const __m512 a = _mm512_set1_ps(xr[i][k]);
      for (int j = 0; j < NP; ++j) acc[i][j] = _mm512_fmadd_ps(a, (__m512)b[j], acc[i][j]);
    }
  }, [&](const lanes::f32x16* m) __attribute__((always_inline)) {
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NP; ++j) acc[i][j] = _mm512_mul_ps(acc[i][j], (__m512)m[j]);
  });
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NP; ++j) _mm512_storeu_ps(r + (i * NP + j) * kPanel, acc[i][j]);
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 acc[MR][2 * NP];
  const float* xr[MR];
  for (int i = 0; i < MR; ++i) {
    xr[i] = x[i] + k0;
    for (int j = 0; j < 2 * NP; ++j) acc[i][j] = cont ? _mm256_loadu_ps(r + i * NP * kPanel + j * 8) : _mm256_setzero_ps();
  }
  const auto fma_rows = [&](int k, const __m256* b) __attribute__((always_inline)) {
    for (int i = 0; i < MR; ++i) {
      const __m256 a = _mm256_set1_ps(xr[i][k]);
      for (int j = 0; j < 2 * NP; ++j) acc[i][j] = _mm256_fmadd_ps(a, b[j], acc[i][j]);
    }
  };
  if constexpr (std::is_base_of_v<PanelLoad, W>) {
    // fp32 panels and widened tiles: each half loaded as its own ymm. Splitting the loaded 16-lane
    // vector (below) became element-wise inserts for the upper half in GCC 12, and the product ran
    // at half the FMA peak (M = 256: 35 against 62-72 GFLOP/s on a Zen 3 core).
    for (int k = 0; k < kc; ++k) {
      __m256 b[2 * NP];
      for (int j = 0; j < NP; ++j) {
        const float* p = w.p + j * w.ps + (size_t)k * kPanel;
        b[2 * j] = _mm256_loadu_ps(p);
        b[2 * j + 1] = _mm256_loadu_ps(p + 8);
      }
      fma_rows(k, b);
    }
  } else {
    // widened in registers: the halves of a computed vector split cleanly
    columns<NP>(w, kc, [&](int k, const lanes::f32x16* v) __attribute__((always_inline)) {
      __m256 b[2 * NP];
      for (int j = 0; j < NP; ++j) {
        b[2 * j] = __builtin_shufflevector(v[j], v[j], 0, 1, 2, 3, 4, 5, 6, 7);
        b[2 * j + 1] = __builtin_shufflevector(v[j], v[j], 8, 9, 10, 11, 12, 13, 14, 15);
      }
      fma_rows(k, b);
    }, [&](const lanes::f32x16* m) __attribute__((always_inline)) {
      for (int i = 0; i < MR; ++i)
        for (int j = 0; j < NP; ++j) {
          acc[i][2 * j] = _mm256_mul_ps(acc[i][2 * j], (__m256)lanes::half<0>(m[j]));
          acc[i][2 * j + 1] = _mm256_mul_ps(acc[i][2 * j + 1], (__m256)lanes::half<1>(m[j]));
        }
    });
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 2 * NP; ++j) _mm256_storeu_ps(r + i * NP * kPanel + j * 8, acc[i][j]);
#else
  // Other targets (aarch64's NEON, x86-64-v2): GCC's vector types. `acc + a * b` is contracted to
  // one fused multiply-add where the target has one (as fmadd in kernels.h), so the chain rounds
  // like the hand-written paths above.
  using lanes::f32x16;
  f32x16 acc[MR][NP];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NP; ++j) acc[i][j] = cont ? lanes::load_f32(r + (i * NP + j) * kPanel) : f32x16{};
  columns<NP>(w, kc, [&](int k, const f32x16* b) __attribute__((always_inline)) {
    for (int i = 0; i < MR; ++i) {
      const float a = x[i][k0 + k];
      for (int j = 0; j < NP; ++j) acc[i][j] = lanes::fmadd_lanes(a, b[j], acc[i][j]);
    }
  }, [&](const f32x16* m) __attribute__((always_inline)) {
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NP; ++j) acc[i][j] = acc[i][j] * m[j];
  });
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NP; ++j) lanes::store(r + (i * NP + j) * kPanel, acc[i][j]);
#endif
}

template <class W>
using PTileFn = void (*)(const float* const*, int, int, const W&, float*, bool);
template <class W, int MR, int... NPs>
static constexpr std::array<PTileFn<W>, sizeof...(NPs)> ptile_row(std::integer_sequence<int, NPs...>) {
  return {&ptile<MR, NPs + 1, W>...};
}
template <class W, int... MRs>
static constexpr std::array<std::array<PTileFn<W>, kPackN>, sizeof...(MRs)> ptile_table(std::integer_sequence<int, MRs...>) {
  return {ptile_row<W, MRs + 1>(std::make_integer_sequence<int, kPackN>{})...};
}
template <class W>
static const auto kPTiles = ptile_table<W>(std::make_integer_sequence<int, kPackM>{});  // [mr-1][np-1]

// Every row tile of x over one span of panels.
template <class W>
static void row_tiles(const float* const* x, int M, int k0, int kc, const W& w, float* out, int ld) {
  for (int a = 0; a < M; a += kPackM) {
    const int mr = std::min(kPackM, M - a);
    kPTiles<W>[mr - 1][(ld / kPanel) - 1](x + a, k0, kc, w, out + (size_t)a * ld, k0 > 0);
  }
}

// K is walked in blocks of kKC: every row tile re-reads the np panels' block (np x kKC x 64 B,
// 128 KB) from L2, half of what one pass over K = 1024 would stream; partial sums wait in out.
static constexpr int kKC = kSpanCols;

// A codec that widens in registers (formats/widen.h, formats/ggml_widen.h) does so inside the
// micro-kernel for one row tile (decode); for more rows a span is widened once into the thread's
// fp32 tile (packed_tiled) and every row tile runs over that.
// P (not void): W's format on the scaled chain (formats/pow2_chain.h), taken per span where
// P::exact() shows it gives W's bits.
template <class W, class P = void>
static void packed_widened(const float* const* x, int M, const Linear& L, int p0, int np, float* out,
                           [[maybe_unused]] const Pow2Rows* xb = nullptr) {
  const int ld = np * kPanel;
  [[maybe_unused]] int64_t scaled = 0, kept = 0;
  [[maybe_unused]] const bool pow2 = !std::is_void_v<P> && g_pow2.enabled.load(std::memory_order_relaxed);
  for (int k0 = 0; k0 < L.in; k0 += kKC) {
    const int kc = std::min(kKC, L.in - k0);
    if constexpr (!std::is_void_v<P>) {
      MagRange xr;
      if (xb) {
        xr = xb->span[k0 / kKC];
      } else if (pow2) {
        for (int i = 0; i < M; ++i) xr.add(x[i] + k0, kc);
      }
      if (pow2 && (P::exact(xr, M, L, p0, np, k0, kc, out, ld) || g_pow2.unguarded.load(std::memory_order_relaxed))) {
        row_tiles(x, M, k0, kc, P(L, p0, k0, kc, np), out, ld);
        ++scaled;
        continue;
      }
      ++kept;
    }
    row_tiles(x, M, k0, kc, W(L, p0, k0, kc, np), out, ld);
  }
  if constexpr (!std::is_void_v<P>) {
    g_pow2.scaled.fetch_add(scaled, std::memory_order_relaxed);
    g_pow2.kept.fetch_add(kept, std::memory_order_relaxed);
  }
}

static void packed_tiled(const float* const* x, int M, const Linear& L, int p0, int np, float* out) {
  const PanelCodec& C = L.p16 ? bf16_codec() : panel_codec(L.qf);
  // Prefill only (M > kPackM): every format has an in-register form for decode (packed_panels). The
  // wide span is reused by every row tile.
  const int K = L.in, st = C.step(L), span = std::max(st, kKC / st * st);
  thread_local std::vector<float> tile;  // [np][span][16]
  if (tile.size() < (size_t)kPackN * span * kPanel) tile.resize((size_t)kPackN * span * kPanel);
  for (int k0 = 0; k0 < K; k0 += span) {
    const int kc = std::min(span, K - k0);
    C.decode(L, p0, np, k0, kc, tile.data());
    row_tiles(x, M, k0, kc, PanelLoad{tile.data(), (size_t)kc * kPanel}, out, np * kPanel);
  }
}

// Decode on a GGUF format's panels: its definition (codecs/all.h) widened in registers (ggml_widen.h),
// on the scaled chain where the format has one; false: no format of that type.
template <class... Q>
static bool packed_ggml(kq::Formats<Q...>, const float* const* x, int M, const Linear& L, int p0, int np, float* out,
                        const Pow2Rows* xb) {
  return ((L.codec->ggml_type == Q::kType &&
           (packed_widened<GgmlWiden<Q>, typename GgmlPow2<Q>::type>(x, M, L, p0, np, out, xb), true)) ||
          ...);
}

void packed_panels(const float* const* x, int M, const Linear& L, int p0, int np, float* out, const Pow2Rows* xb) {
  if (L.p) return packed_widened<F32Panels>(x, M, L, p0, np, out);
  if (M <= kPackM) {
    if (L.p16) return packed_widened<Bf16Widen>(x, M, L, p0, np, out);
    if (L.qf == QFmt::E4M3) return packed_widened<Fp8Widen, Fp8Pow2>(x, M, L, p0, np, out, xb);
    if (L.qf == QFmt::E4M3F) return packed_widened<Fp8FloatWiden>(x, M, L, p0, np, out);
    if (L.qf == QFmt::E2M1) return packed_widened<Fp4Widen, Fp4Pow2>(x, M, L, p0, np, out, xb);
    if (L.qf == QFmt::Ggml && packed_ggml(kq::AllFormats{}, x, M, L, p0, np, out, xb)) return;
  }
  packed_tiled(x, M, L, p0, np, out);
}

// Rows [a0, a1) x panels [p0, p1) of Y = X W^T.
static void packed_block(const float* const* x, int a0, int a1, const Linear& L, int p0, int p1, float* Y,
                         int ldy, std::vector<float>& buf, const Pow2Rows* xb) {
  buf.resize((size_t)(a1 - a0) * kPackN * kPanel);
  for (int p = p0; p < p1; p += kPackN) {
    const int np = std::min(kPackN, p1 - p);
    const int c0 = p * kPanel, nc = std::min(L.out, (p + np) * kPanel) - c0;
    packed_panels(x + a0, a1 - a0, L, p, np, buf.data(), xb);
    for (int i = a0; i < a1; ++i)
      std::memcpy(Y + (size_t)i * ldy + c0, &buf[(size_t)(i - a0) * np * kPanel], sizeof(float) * nc);
  }
}

void linear_rows(const float* const* x, int M, const Linear& L, float* Y, int ldy) {
  thread_local std::vector<float> buf;  // called per query / token block: no allocation per call
  Pow2Rows xb;
  if (pow2_format(L)) xb.init(x, M, L.in);
  packed_block(x, 0, M, L, 0, (L.out + kPanel - 1) / kPanel, Y, ldy, buf, pow2_format(L) ? &xb : nullptr);
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
  Pow2Rows xb;  // the rows' bounds for every column group's scaled-chain check (formats/pow2_chain.h)
  if (pow2_format(L)) xb.init(x.data(), M, L.in);
#pragma omp parallel for num_threads(T) schedule(dynamic, 1) if (T > 1 && work > kParMinWork)
  for (int t = 0; t < ncg * nrb; ++t) {
    const int g = t % ncg, b = t / ncg;
    if (b * rb >= M) continue;
    thread_local std::vector<float> buf;
    packed_block(x.data(), b * rb, std::min(M, (b + 1) * rb), L, g * kPackN, std::min(npan, (g + 1) * kPackN),
                 Y, ldy, buf, pow2_format(L) ? &xb : nullptr);
  }
}

}  // namespace cairn
