// cairn kernel: MoE block (hash or sqrt-softplus top-k routing, clamped SwiGLU experts, one
// shared expert with the same clamp).
//
// Design notes
//  * Prefill groups the chunk's tokens by expert; each expert's ~S*k/E rows are too few for
//    OpenBLAS (packing dominated), so the expert GEMMs use the register-tiled dot-form kernel
//    (kernels.h dot_tile_any) straight over the weight rows; decode (S == 1) takes the same path.
//    act = silu(min(g, L)) * clamp(u, -L, L), applied on the fused gate/up tile.
//  * Routed outputs are accumulated in expert-index order, then the shared expert is added
//    (HF: index_add_ per expert, then routed + shared).
//  * Top-k ties in the router go to the lowest expert index.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>

#include "cairn/forward.h"
#include "cairn/kernels.h"
#include "cairn/profile.h"

namespace cairn {

static inline float softplus(float v) { return v > 20.f ? v : std::log1p(std::exp(v)); }

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
  // Active experts (index order) and the shared expert (last) as jobs. Token rows are read in
  // place through row pointers (no gather copy). Two parallel phases:
  //  1. task = (job, block of kRB intermediate rows): act = SwiGLU(w1 x, w3 x), gate and up rows
  //     computed in the same register tile (dot_tile_any), the clamp/SiLU applied on the tile.
  //  2. task = block of kCB output columns of y: for each job in order, y[rows] += wt * (w2 act);
  //     every y element is owned by one task, so y accumulates the experts in index order and
  //     then the shared expert, independent of how tokens are grouped into chunks.
  struct Job {
    int M = 0;
    const Linear *w1 = nullptr, *w3 = nullptr, *w2 = nullptr;
    std::vector<const float*> xs;  // [M] input rows
    std::vector<int> rows;         // [M] token rows in the chunk
    std::vector<float> rw;         // [M] routing weights (empty: shared, weight 1)
    std::vector<float> act;        // [M, I]
    std::vector<const float*> as;  // [M] act rows
  };
  std::vector<Job> jobs;
  jobs.reserve(E + 1);
  {
    std::vector<int> cnt(E, 0);
    for (int i = 0; i < S * k; ++i) ++cnt[idx[i]];
    for (int e = 0; e < E; ++e) {
      if (!cnt[e]) continue;
      Job j;
      j.rows.reserve(cnt[e]);
      j.rw.reserve(cnt[e]);
      j.w1 = &L.w1[e]; j.w3 = &L.w3[e]; j.w2 = &L.w2[e];
      jobs.push_back(std::move(j));
    }
    std::vector<int> slot(E, -1);
    for (int e = 0, q = 0; e < E; ++e) if (cnt[e]) slot[e] = q++;
    for (int i = 0; i < S; ++i)
      for (int a = 0; a < k; ++a) {
        Job& j = jobs[slot[idx[(size_t)i * k + a]]];
        j.rows.push_back(i);
        j.rw.push_back(wt[(size_t)i * k + a]);
      }
    Job sj;
    sj.w1 = &L.sw1; sj.w3 = &L.sw3; sj.w2 = &L.sw2;
    sj.rows.resize(S);
    std::iota(sj.rows.begin(), sj.rows.end(), 0);
    jobs.push_back(std::move(sj));
  }
  for (Job& j : jobs) {
    j.M = (int)j.rows.size();
    j.xs.resize(j.M);
    for (int a = 0; a < j.M; ++a) j.xs[a] = x + (size_t)j.rows[a] * D;
    const int I = j.w1->out;
    j.act.resize((size_t)j.M * I);
    j.as.resize(j.M);
    for (int a = 0; a < j.M; ++a) j.as[a] = &j.act[(size_t)a * I];
  }
  const int nt = m.threads;
  const float lim = c.swiglu_limit;
  constexpr int kRB = 64, kCB = 64;
  constexpr int GN = kTileN / 2 > 0 ? kTileN / 2 : 1;  // gate (= up) rows per fused tile
  std::vector<std::pair<int, int>> t1;  // (job, first intermediate row)
  for (int jj = 0; jj < (int)jobs.size(); ++jj)
    for (int n0 = 0; n0 < jobs[jj].w1->out; n0 += kRB) t1.emplace_back(jj, n0);
  const int nt1 = (int)t1.size(), nt2 = (D + kCB - 1) / kCB;
  int64_t work = 0;
  for (const Job& j : jobs) work += (int64_t)3 * j.M * j.w1->out * D;
#pragma omp parallel num_threads(nt) if (work > kParMinWork)
  {
#pragma omp for schedule(dynamic, 1)
    for (int t = 0; t < nt1; ++t) {
      Job& j = jobs[t1[t].first];
      const int I = j.w1->out, n0 = t1[t].second, n1 = std::min(I, n0 + kRB);
      for (int n = n0; n < n1; n += GN) {
        const int g = std::min(GN, n1 - n);
        const float* w[2 * GN];
        for (int q = 0; q < g; ++q) {
          w[q] = j.w1->w + (size_t)(n + q) * D;
          w[g + q] = j.w3->w + (size_t)(n + q) * D;
        }
        float r[kTileM * 2 * GN];
        for (int a = 0; a < j.M; a += kTileM) {
          const int mr = std::min(kTileM, j.M - a);
          dot_tile_any(mr, 2 * g, &j.xs[a], w, D, r);
          for (int i = 0; i < mr; ++i) {
            float* dst = &j.act[(size_t)(a + i) * I + n];
            for (int q = 0; q < g; ++q) {
              float ga = std::min(r[i * 2 * g + q], lim);
              float ub = std::min(std::max(r[i * 2 * g + g + q], -lim), lim);
              dst[q] = (ga / (1.f + std::exp(-ga))) * ub;
            }
          }
        }
      }
    }
#pragma omp for schedule(dynamic, 1)
    for (int t = 0; t < nt2; ++t) {
      const int c0 = t * kCB, c1 = std::min(D, c0 + kCB);
      for (int i = 0; i < S; ++i) std::fill(y + (size_t)i * D + c0, y + (size_t)i * D + c1, 0.f);
      for (const Job& j : jobs) {
        const int I = j.w2->in;
        const bool shared = j.rw.empty();
        for (int n = c0; n < c1; n += kTileN) {
          const int nr = std::min(kTileN, c1 - n);
          const float* w[kTileN];
          for (int q = 0; q < nr; ++q) w[q] = j.w2->w + (size_t)(n + q) * I;
          float r[kTileM * kTileN];
          for (int a = 0; a < j.M; a += kTileM) {
            const int mr = std::min(kTileM, j.M - a);
            dot_tile_any(mr, nr, &j.as[a], w, I, r);
            for (int i = 0; i < mr; ++i) {
              float* dst = y + (size_t)j.rows[a + i] * D + n;
              if (shared)
                for (int q = 0; q < nr; ++q) dst[q] = dst[q] + r[i * nr + q];
              else
                for (int q = 0; q < nr; ++q) dst[q] += r[i * nr + q] * j.rw[a + i];
            }
          }
        }
      }
    }
  }
  prof_lap(P_EXPERTS, t0);
  prof_lap(P_SHARED, t0);
}

}  // namespace cairn
