// cairn kernel, Qwen3.5: gated full attention (HF Qwen3_5MoeAttention, docs/design/families.md §2).
//
// Design notes
//  * q_proj gives per head [query | gate] (Dh each). q and k take an RMSNorm over Dh (1+w folded),
//    then NeoX RoPE (rotate-half pairs (i, i + r/2)) on the first r channels, fp32 angles as HF.
//  * K and V rows are appended to the state's page groups (K after norm and RoPE; arrays 2l and
//    2l+1, row-major), then each query row attends
//    causally to rows 0..pos of its kv head (GQA: query head h reads kv head h / (H/Hkv)); no sink.
//  * Scores, softmax and the weighted sum run in a fixed order per (row, head), so a row's bits do
//    not depend on the call it came in; the rows of a kv head's query heads are computed together,
//    each key and value row read once for all of them.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "model.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace cairn::qwen35 {

namespace {
// NeoX RoPE on x[0..r): out[i] = x[i] c - x[i+h] s, out[i+h] = x[i+h] c + x[i] s (h = r/2).
void rope_neox(float* x, int r, const float* c, const float* s) {
  const int h = r / 2;
  for (int i = 0; i < h; ++i) {
    const float x0 = x[i], x1 = x[i + h];
    x[i] = fmadd(x0, c[i], -(x1 * s[i]));
    x[i + h] = fmadd(x1, c[i], x0 * s[i]);
  }
}

// out[r] = dot(a[r], b, n) for NR rows sharing the key row b: each the very operations of dot()
// (gemm.cpp: 32 lane accumulators over ascending blocks of 32, then of 8, the same tree, the same
// tail), with b's values loaded once for the NR rows.
template <int NR>
void dot_rows(const float* const* a, const float* b, int n, float* out) {
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc[NR][4];
  for (int r = 0; r < NR; ++r)
    for (int q = 0; q < 4; ++q) acc[r][q] = _mm256_setzero_ps();
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256 b0 = _mm256_loadu_ps(b + i), b1 = _mm256_loadu_ps(b + i + 8), b2 = _mm256_loadu_ps(b + i + 16),
                 b3 = _mm256_loadu_ps(b + i + 24);
    for (int r = 0; r < NR; ++r) {
      acc[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(a[r] + i), b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(_mm256_loadu_ps(a[r] + i + 8), b1, acc[r][1]);
      acc[r][2] = _mm256_fmadd_ps(_mm256_loadu_ps(a[r] + i + 16), b2, acc[r][2]);
      acc[r][3] = _mm256_fmadd_ps(_mm256_loadu_ps(a[r] + i + 24), b3, acc[r][3]);
    }
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 b0 = _mm256_loadu_ps(b + i);
    for (int r = 0; r < NR; ++r) acc[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(a[r] + i), b0, acc[r][0]);
  }
  for (int r = 0; r < NR; ++r) {
    // t[j] = (acc[j] + acc[8+j]) + (acc[16+j] + acc[24+j]); ((t0+t4) + (t1+t5)) + ((t2+t6) + (t3+t7))
    const __m256 t = _mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), _mm256_add_ps(acc[r][2], acc[r][3]));
    const __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    const __m128 h = _mm_hadd_ps(u, u);  // (u0 + u1, u2 + u3, ...)
    float s = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
    for (int k = i; k < n; ++k) s = fmadd(a[r][k], b[k], s);
    out[r] = s;
  }
#else
  for (int r = 0; r < NR; ++r) out[r] = dot(a[r], b, n);
#endif
}

// out[r][d] (r < NR) continues the chain acc = fmadd(w[r][j], v_j[d], acc) over j in [j0, j1),
// ascending, from out's values (0 before the first key): 32 columns of the NR rows in registers
// across the keys. Per (r, d) the same fmadds in the same order whatever the blocks.
template <int NR>
void weighted_rows(float* const* out, const float* const* w, const float* const* vrow, size_t j0, size_t j1, int Dh) {
  int d0 = 0;
#if defined(__AVX2__) && defined(__FMA__)
  for (; d0 + 32 <= Dh; d0 += 32) {
    __m256 acc[NR][4];
    for (int r = 0; r < NR; ++r)
      for (int q = 0; q < 4; ++q) acc[r][q] = _mm256_loadu_ps(out[r] + d0 + 8 * q);
    for (size_t j = j0; j < j1; ++j) {
      const float* v = vrow[j] + d0;
      const __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8), v2 = _mm256_loadu_ps(v + 16),
                   v3 = _mm256_loadu_ps(v + 24);
      for (int r = 0; r < NR; ++r) {
        const __m256 pj = _mm256_broadcast_ss(w[r] + j);
        acc[r][0] = _mm256_fmadd_ps(pj, v0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(pj, v1, acc[r][1]);
        acc[r][2] = _mm256_fmadd_ps(pj, v2, acc[r][2]);
        acc[r][3] = _mm256_fmadd_ps(pj, v3, acc[r][3]);
      }
    }
    for (int r = 0; r < NR; ++r)
      for (int q = 0; q < 4; ++q) _mm256_storeu_ps(out[r] + d0 + 8 * q, acc[r][q]);
  }
#endif
  for (int r = 0; r < NR; ++r)
    for (size_t j = j0; j < j1; ++j) {
      const float pj = w[r][j];
      const float* v = vrow[j];
      for (int d = d0; d < Dh; ++d) out[r][d] = fmadd(pj, v[d], out[r][d]);
    }
}
}  // namespace

void attention_block(const Model& m, int layer, PageTable& pages, int64_t pos0, const float* x, int S, float* y) {
  const Config& c = m.cfg;
  const AttnW& w = m.layers[layer].attn;
  const int H = c.H, Hkv = c.Hkv, Dh = c.Dh, r = c.r, qd = H * Dh, kvd = Hkv * Dh, grp = H / Hkv;
  std::vector<float> qg((size_t)S * 2 * qd);  // [S, H, 2*Dh]: query | gate per head
  linear(x, S, w.q, qg.data(), m.threads);
  const size_t n0 = (size_t)pos0;  // rows already in the pages
  const int ak = 2 * layer, av = 2 * layer + 1;  // this layer's K and V arrays in the page groups
  std::vector<float> kv((size_t)S * 2 * kvd);  // [S, kvd] K rows, then [S, kvd] V rows
  float* kn = kv.data();
  linear(x, S, w.k, kn, m.threads);
  linear(x, S, w.v, kn + (size_t)S * kvd, m.threads);
  std::vector<float> cs((size_t)S * r);  // [S, r/2 cos | r/2 sin]
  for (int t = 0; t < S; ++t) rope_cs(pos0 + t, r / 2, m.inv_freq.data(), &cs[(size_t)t * r], &cs[(size_t)t * r + r / 2]);
  for (int t = 0; t < S; ++t) {
    const float *ct = &cs[(size_t)t * r], *st = ct + r / 2;
    for (int h = 0; h < H; ++h) {
      float* q = &qg[(size_t)t * 2 * qd + (size_t)h * 2 * Dh];
      rmsnorm(q, w.q_norm.data(), q, Dh, c.rms_eps);
      rope_neox(q, r, ct, st);
    }
    for (int h = 0; h < Hkv; ++h) {
      float* k = kn + (size_t)t * kvd + (size_t)h * Dh;
      rmsnorm(k, w.k_norm.data(), k, Dh, c.rms_eps);
      rope_neox(k, r, ct, st);
    }
  }
  for (int t = 0; t < S; ++t) {  // appended in token order (a group is allocated, or copied, on its first write)
    pages.write_row(ak, (int64_t)n0 + t, kn + (size_t)t * kvd);
    pages.write_row(av, (int64_t)n0 + t, kn + (size_t)(S + t) * kvd);
  }

  const float scale = (float)std::pow((double)Dh, -0.5);  // HF: head_dim ** -0.5, then a fp32 multiply
  std::vector<float> o((size_t)S * qd);  // [S, H*Dh]
  // Tasks: a kv head and a block of kTok tokens, i.e. its grp query heads' rows of those tokens. Each
  // key and value row is read once per task and used by all of them (it stays in cache), not once per
  // (token, head): at a 5k-token depth that was most of a prefill's time; rows go in pairs through
  // dot_rows and weighted_rows (a key or value row loaded once for two, the weighted sums' accumulators
  // in registers). Every row's own sequence of operations is the one a row alone would run (scores by
  // ascending key, the max, exp and sum in that order, the weighted sum by ascending key), so the bits
  // do not depend on S, the blocks or the pairs.
  constexpr int kTok = 4;
  const int nblk = (S + kTok - 1) / kTok;
  const int64_t work = (int64_t)S * H * (n0 + S) * Dh * 2;
#pragma omp parallel num_threads(m.threads) if (work > kParMinWork)
  {
    std::vector<float> p;                       // [rows][n0 + t1]: the task's scores, then weights
    std::vector<const float*> kr, vr;           // [n0 + t1]: this kv head's key and value rows
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < Hkv * nblk; ++task) {
      const int g = task % Hkv, t0 = task / Hkv * kTok, t1 = std::min(S, t0 + kTok), R = (t1 - t0) * grp;
      const size_t nmax = n0 + t1;              // keys the block's last token sees
      p.resize((size_t)R * nmax);
      auto query = [&](int i) { return &qg[(size_t)(t0 + i / grp) * 2 * qd + (size_t)(g * grp + i % grp) * 2 * Dh]; };
      auto seen = [&](int i) { return n0 + (size_t)(t0 + i / grp) + 1; };  // causal: rows 0..pos
      auto out = [&](int i) { return &o[(size_t)(t0 + i / grp) * qd + (size_t)(g * grp + i % grp) * Dh]; };
      kr.resize(nmax);
      vr.resize(nmax);
      for (size_t j = 0; j < nmax; ++j) {
        kr[j] = pages.row(ak, (int64_t)j) + (size_t)g * Dh;
        vr[j] = pages.row(av, (int64_t)j) + (size_t)g * Dh;
      }
      // Rows in pairs of one token (the same keys seen), keys in blocks of kKeys: a block's key (and
      // value) rows are read from memory once for the task and from cache by every pair.
      constexpr size_t kKeys = 64;
      auto pairs = [&](auto&& each) {  // each(first row, two rows?)
        for (int i = 0; i < R;) {
          const bool two = i % grp + 1 < grp;
          each(i, two);
          i += two ? 2 : 1;
        }
      };
      for (size_t jb = 0; jb < nmax; jb += kKeys)
        pairs([&](int i, bool two) {
          const size_t j1 = std::min(seen(i), jb + kKeys);
          const float* q[2] = {query(i), two ? query(i + 1) : nullptr};
          float sc[2];
          for (size_t j = jb; j < j1; ++j) {
            if (two) dot_rows<2>(q, kr[j], Dh, sc);
            else dot_rows<1>(q, kr[j], Dh, sc);
            p[(size_t)i * nmax + j] = sc[0] * scale;
            if (two) p[(size_t)(i + 1) * nmax + j] = sc[1] * scale;
          }
        });
      for (int i = 0; i < R; ++i) {
        float* pi = &p[(size_t)i * nmax];
        const size_t n = seen(i);
        float mx = -INFINITY, sum = 0.f;
        for (size_t j = 0; j < n; ++j) mx = std::max(mx, pi[j]);
        for (size_t j = 0; j < n; ++j) pi[j] -= mx;
        vexp(pi, pi, (int)n);  // fexp's bits, in vectors
        for (size_t j = 0; j < n; ++j) sum += pi[j];
        for (size_t j = 0; j < n; ++j) pi[j] = pi[j] / sum;
        std::fill(out(i), out(i) + Dh, 0.f);
      }
      for (size_t jb = 0; jb < nmax; jb += kKeys)
        pairs([&](int i, bool two) {
          const size_t j1 = std::min(seen(i), jb + kKeys);
          if (j1 <= jb) return;
          float* ot[2] = {out(i), two ? out(i + 1) : nullptr};
          const float* w[2] = {&p[(size_t)i * nmax], two ? &p[(size_t)(i + 1) * nmax] : nullptr};
          if (two) weighted_rows<2>(ot, w, vr.data(), jb, j1, Dh);
          else weighted_rows<1>(ot, w, vr.data(), jb, j1, Dh);
        });
      for (int i = 0; i < R; ++i) {
        const float* gate = query(i) + Dh;
        float* ot = out(i);
        for (int d = 0; d < Dh; ++d) ot[d] = ot[d] * sigmoid(gate[d]);
      }
    }
  }
  linear(o.data(), S, w.o, y, m.threads);
}

}  // namespace cairn::qwen35
