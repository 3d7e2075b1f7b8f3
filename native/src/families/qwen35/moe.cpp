// cairn kernel, Qwen3.5: the MLP -- MoE (HF Qwen3_5MoeSparseMoeBlock) or dense SwiGLU (Qwen3_5MLP).
//
// Design notes
//  * Router: p = softmax(h gate^T) over E in fp32; top-k of p (ties to the lowest index: a later
//    expert displaces only on a strictly greater value), weights p_topk / sum p_topk.
//  * Experts: act = silu(g) * u (no clamp), fused gate/up panels as V4's w13; the routed outputs are
//    accumulated into y in expert-index order (HF's index_add_ order), then the shared expert times
//    sigmoid(h shared_expert_gate^T) is added. Each row's sum has that fixed order whatever the
//    other rows of the call, so the bits do not depend on the chunking.
//  * V4's MoE executor is bound to V4's layer weights and clamp (moe_executor.h); this is a plain
//    resident version over the same packed product. Paging experts for this family comes later.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "model.h"

namespace cairn::qwen35 {

namespace {
// out [M, D] = down(silu(gate x) * up x) for rows x[0..M) (pointers), on the calling thread.
void swiglu_rows(const MlpW& f, const float* const* x, int M, float* out, int D) {
  const int Ip = f.w13.out / 2;
  std::vector<float> gu((size_t)M * f.w13.out), act((size_t)M * Ip);  // [M, 2*Ip] panel pairs, [M, Ip]
  linear_rows(x, M, f.w13, gu.data(), f.w13.out);
  for (int i = 0; i < M; ++i) {
    const float* ri = &gu[(size_t)i * f.w13.out];
    float* ai = &act[(size_t)i * Ip];
    for (int q = 0; q < Ip / kPanel; ++q)
      for (int l = 0; l < kPanel; ++l)
        ai[q * kPanel + l] = silu(ri[(2 * q) * kPanel + l]) * ri[(2 * q + 1) * kPanel + l];
  }
  std::vector<const float*> ar(M);
  for (int i = 0; i < M; ++i) ar[i] = &act[(size_t)i * Ip];
  linear_rows(ar.data(), M, f.down, out, D);
}

// The same over [S, D] rows in blocks of rows across threads.
void swiglu(const Model& m, const MlpW& f, const float* x, int S, float* out) {
  const int D = m.cfg.D;
  constexpr int kRows = 8;
  const int nb = (S + kRows - 1) / kRows;
#pragma omp parallel for num_threads(m.threads) schedule(dynamic, 1) \
    if (nb > 1 && (int64_t)S * f.w13.out * D > kParMinWork)
  for (int b = 0; b < nb; ++b) {
    const int i0 = b * kRows, M = std::min(kRows, S - i0);
    std::vector<const float*> xr(M);
    for (int i = 0; i < M; ++i) xr[i] = x + (size_t)(i0 + i) * D;
    swiglu_rows(f, xr.data(), M, out + (size_t)i0 * D, D);
  }
}

// idx/wt [S, k]: each row's experts (descending p, ties to the lowest index) and weights
void route(const Model& m, const LayerW& L, const float* x, int S, std::vector<int>& idx, std::vector<float>& wt) {
  const int E = m.cfg.E, k = m.cfg.k;
  std::vector<float> p((size_t)S * E);  // [S, E]
  linear(x, S, L.router, p.data(), m.threads);
  idx.resize((size_t)S * k);
  wt.resize((size_t)S * k);
  for (int i = 0; i < S; ++i) {
    float* pi = &p[(size_t)i * E];
    float mx = -INFINITY;
    for (int e = 0; e < E; ++e) mx = std::max(mx, pi[e]);
    float sum = 0.f;
    for (int e = 0; e < E; ++e) {
      pi[e] = fexp(pi[e] - mx);
      sum += pi[e];
    }
    for (int e = 0; e < E; ++e) pi[e] = pi[e] / sum;
    int* ix = &idx[(size_t)i * k];
    int n = 0;
    for (int e = 0; e < E; ++e) {
      const float v = pi[e];
      if (n == k && !(v > pi[ix[k - 1]])) continue;
      int pos = n < k ? n++ : k - 1;
      while (pos > 0 && v > pi[ix[pos - 1]]) {
        ix[pos] = ix[pos - 1];
        --pos;
      }
      ix[pos] = e;
    }
    float top = 0.f;
    for (int j = 0; j < k; ++j) top += pi[ix[j]];
    for (int j = 0; j < k; ++j) wt[(size_t)i * k + j] = pi[ix[j]] / top;
  }
}
}  // namespace

void mlp_block(const Model& m, int layer, const float* x, int S, float* y) {
  const Config& c = m.cfg;
  const LayerW& L = m.layers[layer];
  const int D = c.D;
  if (!c.moe()) {
    swiglu(m, L.shared, x, S, y);
    return;
  }
  std::vector<int> idx;
  std::vector<float> wt;
  route(m, L, x, S, idx, wt);
  // each active expert's rows (token order) and their weights
  std::vector<std::vector<int>> rows(c.E);
  std::vector<std::vector<float>> rw(c.E);
  for (int i = 0; i < S; ++i)
    for (int j = 0; j < c.k; ++j) {
      rows[idx[(size_t)i * c.k + j]].push_back(i);
      rw[idx[(size_t)i * c.k + j]].push_back(wt[(size_t)i * c.k + j]);
    }
  std::vector<int> active;
  for (int e = 0; e < c.E; ++e)
    if (!rows[e].empty()) active.push_back(e);
  std::vector<std::vector<float>> out(active.size());  // [rows of e, D] per active expert
#pragma omp parallel for num_threads(m.threads) schedule(dynamic, 1) \
    if (active.size() > 1 && (int64_t)S * c.k * 3 * c.I * D > kParMinWork)
  for (size_t a = 0; a < active.size(); ++a) {
    const int e = active[a], M = (int)rows[e].size();
    std::vector<const float*> xr(M);
    for (int i = 0; i < M; ++i) xr[i] = x + (size_t)rows[e][i] * D;
    out[a].resize((size_t)M * D);
    swiglu_rows(L.experts[e], xr.data(), M, out[a].data(), D);
  }
  std::vector<float> sh((size_t)S * D), sg(S);  // shared expert [S, D], its gate logit [S]
  swiglu(m, L.shared, x, S, sh.data());
  linear(x, S, L.shared_gate, sg.data(), m.threads);
  std::fill(y, y + (size_t)S * D, 0.f);
  for (size_t a = 0; a < active.size(); ++a) {
    const int e = active[a];
    for (size_t i = 0; i < rows[e].size(); ++i) {
      float* yi = y + (size_t)rows[e][i] * D;
      const float* oi = &out[a][i * D];
      const float w = rw[e][i];
      for (int d = 0; d < D; ++d) yi[d] = fmadd(oi[d], w, yi[d]);
    }
  }
  for (int i = 0; i < S; ++i) {
    const float g = sigmoid(sg[i]);
    float* yi = y + (size_t)i * D;
    const float* si = &sh[(size_t)i * D];
    for (int d = 0; d < D; ++d) yi[d] = fmadd(g, si[d], yi[d]);
  }
}

}  // namespace cairn::qwen35
