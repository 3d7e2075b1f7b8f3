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
  // key and value row is read once per task and used by all of them (it stays in L1), not once per
  // (token, head): at a 5k-token depth that was most of a prefill's time. Every row's own sequence
  // of operations is the one a row alone would run (scores by ascending key, the max, exp and sum in
  // that order, the weighted sum by ascending key), so the bits do not depend on S or the blocks.
  constexpr int kTok = 4;
  const int nblk = (S + kTok - 1) / kTok;
  const int64_t work = (int64_t)S * H * (n0 + S) * Dh * 2;
#pragma omp parallel num_threads(m.threads) if (work > kParMinWork)
  {
    std::vector<float> p;                       // [rows][n0 + t1]: the task's scores, then weights
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < Hkv * nblk; ++task) {
      const int g = task % Hkv, t0 = task / Hkv * kTok, t1 = std::min(S, t0 + kTok), R = (t1 - t0) * grp;
      const size_t nmax = n0 + t1;              // keys the block's last token sees
      p.resize((size_t)R * nmax);
      auto query = [&](int i) { return &qg[(size_t)(t0 + i / grp) * 2 * qd + (size_t)(g * grp + i % grp) * 2 * Dh]; };
      auto seen = [&](int i) { return n0 + (size_t)(t0 + i / grp) + 1; };  // causal: rows 0..pos
      auto out = [&](int i) { return &o[(size_t)(t0 + i / grp) * qd + (size_t)(g * grp + i % grp) * Dh]; };
      for (size_t j = 0; j < nmax; ++j) {
        const float* kj = pages.row(ak, (int64_t)j) + (size_t)g * Dh;
        for (int i = 0; i < R; ++i)
          if (j < seen(i)) p[(size_t)i * nmax + j] = dot(query(i), kj, Dh) * scale;
      }
      std::vector<float> inv(R);
      for (int i = 0; i < R; ++i) {
        float* pi = &p[(size_t)i * nmax];
        const size_t n = seen(i);
        float mx = -INFINITY, sum = 0.f;
        for (size_t j = 0; j < n; ++j) mx = std::max(mx, pi[j]);
        for (size_t j = 0; j < n; ++j) pi[j] -= mx;
        vexp(pi, pi, (int)n);  // fexp's bits, in vectors
        for (size_t j = 0; j < n; ++j) sum += pi[j];
        inv[i] = sum;
        std::fill(out(i), out(i) + Dh, 0.f);
      }
      for (size_t j = 0; j < nmax; ++j) {
        const float* vj = pages.row(av, (int64_t)j) + (size_t)g * Dh;
        for (int i = 0; i < R; ++i) {
          if (j >= seen(i)) continue;
          const float pj = p[(size_t)i * nmax + j] / inv[i];
          float* ot = out(i);
          for (int d = 0; d < Dh; ++d) ot[d] = fmadd(pj, vj[d], ot[d]);
        }
      }
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
