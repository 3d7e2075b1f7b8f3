// cairn kernel: MoE block (hash or sqrt-softplus top-k routing, clamped SwiGLU experts, one
// shared expert with the same clamp).
//
// Design notes
//  * Prefill groups the chunk's tokens by expert and runs each expert as GEMMs over its rows;
//    decode (S == 1) goes through the same code with M == 1 (AVX2 GEMV).
//  * Routed outputs are accumulated in expert-index order, then the shared expert is added
//    (HF: index_add_ per expert, then routed + shared).
//  * Top-k ties in the router go to the lowest expert index.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "cairn/forward.h"
#include "cairn/kernels.h"

namespace cairn {

static inline float softplus(float v) { return v > 20.f ? v : std::log1p(std::exp(v)); }

// act[M, I] = silu(min(g, L)) * clamp(u, -L, L)
static void swiglu(float* g, const float* u, size_t n, float lim) {
  for (size_t i = 0; i < n; ++i) {
    float a = std::min(g[i], lim);
    float b = std::min(std::max(u[i], -lim), lim);
    g[i] = (a / (1.f + std::exp(-a))) * b;
  }
}

static void mlp(const Model& m, const Linear& w1, const Linear& w3, const Linear& w2,
                const float* x, int M, float* out /*[M, D]*/) {
  const int I = w1.out;
  std::vector<float> g((size_t)M * I), u((size_t)M * I);
  linear(x, M, w1, g.data(), m.threads);
  linear(x, M, w3, u.data(), m.threads);
  swiglu(g.data(), u.data(), g.size(), m.cfg.swiglu_limit);
  linear(g.data(), M, w2, out, m.threads);
}

void moe_block(const Model& m, int layer, const float* x, const int32_t* tokens, int S, float* y) {
  const Config& c = m.cfg;
  const LayerW& L = m.layers[layer];
  const int D = c.D, E = c.E, k = c.k;
  std::vector<float> logits((size_t)S * E);  // [S, E]
  linear(x, S, L.gate, logits.data(), m.threads);
  std::vector<int> idx((size_t)S * k);
  std::vector<float> wt((size_t)S * k);
  for (int i = 0; i < S; ++i) {
    float* lg = &logits[(size_t)i * E];
    for (int e = 0; e < E; ++e) lg[e] = std::sqrt(softplus(lg[e]));  // scores
    int* ix = &idx[(size_t)i * k];
    if (c.hash_moe[layer]) {
      for (int j = 0; j < k; ++j) ix[j] = L.tid2eid[(size_t)tokens[i] * k + j];
    } else {
      std::vector<int> ord(E);
      std::iota(ord.begin(), ord.end(), 0);
      const float* b = L.gate_bias;
      std::partial_sort(ord.begin(), ord.begin() + k, ord.end(), [&](int a, int bb) {
        float va = lg[a] + b[a], vb = lg[bb] + b[bb];
        return va > vb || (va == vb && a < bb);
      });
      for (int j = 0; j < k; ++j) ix[j] = ord[j];
    }
    float sum = 0.f;
    for (int j = 0; j < k; ++j) sum += lg[ix[j]];
    for (int j = 0; j < k; ++j) wt[(size_t)i * k + j] = lg[ix[j]] / (sum + 1e-20f) * c.routed_scale;
  }
  // routed experts
  std::vector<float> routed((size_t)S * D, 0.f);
  std::vector<int> rows;
  std::vector<float> rw, xe, oe;
  for (int e = 0; e < E; ++e) {
    rows.clear();
    rw.clear();
    for (int i = 0; i < S; ++i)
      for (int j = 0; j < k; ++j)
        if (idx[(size_t)i * k + j] == e) { rows.push_back(i); rw.push_back(wt[(size_t)i * k + j]); }
    if (rows.empty()) continue;
    const int M = (int)rows.size();
    xe.resize((size_t)M * D);
    oe.resize((size_t)M * D);
    for (int a = 0; a < M; ++a) std::memcpy(&xe[(size_t)a * D], x + (size_t)rows[a] * D, sizeof(float) * D);
    mlp(m, L.w1[e], L.w3[e], L.w2[e], xe.data(), M, oe.data());
    for (int a = 0; a < M; ++a) {
      float* dst = &routed[(size_t)rows[a] * D];
      const float* src = &oe[(size_t)a * D];
      for (int d = 0; d < D; ++d) dst[d] += src[d] * rw[a];
    }
  }
  // shared expert
  mlp(m, L.sw1, L.sw3, L.sw2, x, S, y);
  for (size_t i = 0; i < (size_t)S * D; ++i) y[i] = routed[i] + y[i];
}

}  // namespace cairn
