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
#include "cairn/profile.h"

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

void moe_block(const Model& m, int layer, const float* x, const int32_t* tokens, int S, float* y) {
  const Config& c = m.cfg;
  const LayerW& L = m.layers[layer];
  const int D = c.D, E = c.E, k = c.k;
  double t0 = omp_get_wtime();
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
  prof_lap(P_ROUTER, t0);
  // Active experts (and the shared expert, last) as jobs; all their GEMMs run as one task
  // list per phase: task = (job, slice of output columns), each a single-threaded GEMM.
  // Two parallel regions per MoE block instead of three per expert: far fewer barriers,
  // and small experts no longer leave a thread idle.
  struct Job {
    const float* x;                // [M, D] input rows
    int M;
    const Linear *w1, *w3, *w2;
    std::vector<int> rows;         // token rows (routed)
    std::vector<float> rw;         // routing weights (routed)
    std::vector<float> xe, g, u, out;  // [M, D], [M, I], [M, I], [M, D]
  };
  std::vector<Job> jobs;
  jobs.reserve(E + 1);
  for (int e = 0; e < E; ++e) {
    Job j{};
    for (int i = 0; i < S; ++i)
      for (int a = 0; a < k; ++a)
        if (idx[(size_t)i * k + a] == e) { j.rows.push_back(i); j.rw.push_back(wt[(size_t)i * k + a]); }
    if (j.rows.empty()) continue;
    j.M = (int)j.rows.size();
    j.xe.resize((size_t)j.M * D);
    for (int a = 0; a < j.M; ++a) std::memcpy(&j.xe[(size_t)a * D], x + (size_t)j.rows[a] * D, sizeof(float) * D);
    j.x = j.xe.data();
    j.w1 = &L.w1[e]; j.w3 = &L.w3[e]; j.w2 = &L.w2[e];
    jobs.push_back(std::move(j));
  }
  {
    Job j{};
    j.x = x; j.M = S; j.w1 = &L.sw1; j.w3 = &L.sw3; j.w2 = &L.sw2;
    jobs.push_back(std::move(j));
  }
  for (Job& j : jobs) {
    j.g.resize((size_t)j.M * j.w1->out);
    j.u.resize((size_t)j.M * j.w1->out);
    j.out.resize((size_t)j.M * D);
  }
  // column slices per job: whole jobs when there are enough of them to balance dynamically
  const int nt = m.threads, nsl = (int)jobs.size() >= 3 * nt ? 1 : nt;
  const int ntask = (int)jobs.size() * nsl;
  const float lim = c.swiglu_limit;
  auto slice = [&](int n, int s, int& n0, int& n1) {
    int per = ((n + nsl - 1) / nsl + 15) / 16 * 16;
    n0 = std::min(n, s * per);
    n1 = std::min(n, n0 + per);
  };
  int64_t work = 0;
  for (const Job& j : jobs) work += (int64_t)3 * j.M * j.w1->out * D;
#pragma omp parallel num_threads(nt) if (work > kParMinWork)
  {
#pragma omp for schedule(dynamic, 1)
    for (int t = 0; t < ntask; ++t) {
      Job& j = jobs[t / nsl];
      const int I = j.w1->out;
      int n0, n1;
      slice(I, t % nsl, n0, n1);
      if (n1 <= n0) continue;
      matmul(j.x, j.M, D, D, j.w1->w + (size_t)n0 * D, n1 - n0, j.g.data() + n0, I, 1);
      matmul(j.x, j.M, D, D, j.w3->w + (size_t)n0 * D, n1 - n0, j.u.data() + n0, I, 1);
      for (int a = 0; a < j.M; ++a)
        swiglu(&j.g[(size_t)a * I + n0], &j.u[(size_t)a * I + n0], n1 - n0, lim);
    }
#pragma omp for schedule(dynamic, 1)
    for (int t = 0; t < ntask; ++t) {
      Job& j = jobs[t / nsl];
      const int I = j.w1->out;
      int n0, n1;
      slice(D, t % nsl, n0, n1);
      if (n1 <= n0) continue;
      matmul(j.g.data(), j.M, I, I, j.w2->w + (size_t)n0 * I, n1 - n0, j.out.data() + n0, D, 1);
    }
  }
  prof_lap(P_EXPERTS, t0);
  // y = sum over experts in index order of w * expert(x), then + shared
  std::fill(y, y + (size_t)S * D, 0.f);
  for (size_t jj = 0; jj + 1 < jobs.size(); ++jj) {
    const Job& j = jobs[jj];
    for (int a = 0; a < j.M; ++a) {
      float* dst = y + (size_t)j.rows[a] * D;
      const float* src = &j.out[(size_t)a * D];
      const float w = j.rw[a];
      for (int d = 0; d < D; ++d) dst[d] += src[d] * w;
    }
  }
  const float* sh = jobs.back().out.data();
  for (size_t i = 0; i < (size_t)S * D; ++i) y[i] = y[i] + sh[i];
  prof_lap(P_SHARED, t0);
}

}  // namespace cairn
