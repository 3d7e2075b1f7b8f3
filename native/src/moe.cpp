// cairn kernel: MoE block (hash or sqrt-softplus top-k routing, clamped SwiGLU experts, one
// shared expert with the same clamp).
//
// Design notes
//  * Prefill groups the chunk's tokens by expert; each expert's ~S*k/E rows run on the packed
//    panels (packed.cpp, packed once at load -- OpenBLAS would re-pack the weight per call);
//    decode (S == 1) takes the same path. act = silu(min(g, L)) * clamp(u, -L, L), applied on
//    the fused gate/up tile.
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
      // top-k of score + bias by insertion into a sorted list of k (ties: lowest index first,
      // since a later expert only displaces on a strictly greater value)
      const float* b = L.gate_bias;
      int n = 0;
      for (int e = 0; e < E; ++e) {
        const float v = lg[e] + b[e];
        if (n == k && !(v > lg[ix[k - 1]] + b[ix[k - 1]])) continue;
        int pos = n < k ? n++ : k - 1;
        while (pos > 0 && v > lg[ix[pos - 1]] + b[ix[pos - 1]]) {
          ix[pos] = ix[pos - 1];
          --pos;
        }
        ix[pos] = e;
      }
    }
    float sum = 0.f;
    for (int j = 0; j < k; ++j) sum += lg[ix[j]];
    for (int j = 0; j < k; ++j) wt[(size_t)i * k + j] = lg[ix[j]] / (sum + 1e-20f) * c.routed_scale;
  }
  prof_lap(P_ROUTER, t0);
  // Active experts (index order) and the shared expert (last) as jobs. Token rows are read in
  // place through row pointers (no gather copy). Two parallel phases on the packed panels:
  //  1. task = (job, kPackN panels of the fused gate/up weight): act = SwiGLU(w1 x, w3 x), gate
  //     and up from neighbouring panels of the same tile, the clamp/SiLU applied on the tile.
  //  2. task = kPackN panels (16 columns each) of y: for each job in order, y[rows] += wt * (w2 act);
  //     every y element is owned by one task, so y accumulates the experts in index order and
  //     then the shared expert, independent of how tokens are grouped into chunks.
  struct Job {
    int M = 0;
    const Linear *w13 = nullptr, *w2 = nullptr;
    std::vector<int> rows;         // [M] token rows in the chunk
    std::vector<float> rw;         // [M] routing weights (empty: shared, weight 1)
    std::vector<const float*> xs;  // [M] input rows
    std::vector<float> act;        // [M, Ip] (Ip = I rounded up to panels; padding stays 0)
    std::vector<const float*> as;  // [M] act rows
  };
  std::vector<Job> jobs;
  jobs.reserve(E + 1);
  {
    std::vector<int> cnt(E, 0), slot(E, -1);
    for (int i = 0; i < S * k; ++i) ++cnt[idx[i]];
    for (int e = 0; e < E; ++e) {
      if (!cnt[e]) continue;
      slot[e] = (int)jobs.size();
      Job j;
      j.rows.reserve(cnt[e]);
      j.rw.reserve(cnt[e]);
      j.w13 = &L.w13[e]; j.w2 = &L.w2[e];
      jobs.push_back(std::move(j));
    }
    for (int i = 0; i < S; ++i)
      for (int a = 0; a < k; ++a) {
        Job& j = jobs[slot[idx[(size_t)i * k + a]]];
        j.rows.push_back(i);
        j.rw.push_back(wt[(size_t)i * k + a]);
      }
    Job sj;
    sj.w13 = &L.sw13; sj.w2 = &L.sw2;
    sj.rows.resize(S);
    std::iota(sj.rows.begin(), sj.rows.end(), 0);
    jobs.push_back(std::move(sj));
  }
  for (Job& j : jobs) {
    j.M = (int)j.rows.size();
    j.xs.resize(j.M);
    for (int a = 0; a < j.M; ++a) j.xs[a] = x + (size_t)j.rows[a] * D;
    const int Ip = j.w13->out / 2;
    j.act.resize((size_t)j.M * Ip);
    j.as.resize(j.M);
    for (int a = 0; a < j.M; ++a) j.as[a] = &j.act[(size_t)a * Ip];
  }
  static_assert(kPackN % 2 == 0, "fused gate/up tiles take panels in pairs");
  const int nt = m.threads;
  const float lim = c.swiglu_limit;
  std::vector<std::pair<int, int>> t1;  // (job, first fused panel)
  for (int jj = 0; jj < (int)jobs.size(); ++jj)
    for (int p = 0; p < jobs[jj].w13->out / kPanel; p += kPackN) t1.emplace_back(jj, p);
  const int npan2 = (D + kPanel - 1) / kPanel;
  const int nt1 = (int)t1.size(), nt2 = (npan2 + kPackN - 1) / kPackN;
  int64_t work = 0;
  for (const Job& j : jobs) work += (int64_t)3 * j.M * j.w2->in * D;
#pragma omp parallel num_threads(nt) if (work > kParMinWork)
  {
    std::vector<float> buf;  // [M, kPackN*16] one task's tile results
#pragma omp for schedule(dynamic, 1)
    for (int t = 0; t < nt1; ++t) {
      Job& j = jobs[t1[t].first];
      const int p0 = t1[t].second, np = std::min(kPackN, j.w13->out / kPanel - p0), ld = np * kPanel;
      const int Ip = j.w13->out / 2;
      buf.resize((size_t)j.M * ld);
      packed_panels(j.xs.data(), j.M, *j.w13, p0, np, buf.data());
      for (int i = 0; i < j.M; ++i) {
        const float* ri = &buf[(size_t)i * ld];
        float* dst = &j.act[(size_t)i * Ip + (size_t)(p0 / 2) * kPanel];
        for (int q = 0; q < np / 2; ++q) {
          float ga[kPanel], en[kPanel];
          for (int l = 0; l < kPanel; ++l) {
            ga[l] = std::min(ri[(2 * q) * kPanel + l], lim);
            en[l] = -ga[l];
          }
          vexp(en, en, kPanel);
          for (int l = 0; l < kPanel; ++l) {
            const float ub = std::min(std::max(ri[(2 * q + 1) * kPanel + l], -lim), lim);
            dst[q * kPanel + l] = (ga[l] / (1.f + en[l])) * ub;
          }
        }
      }
    }
#pragma omp for schedule(dynamic, 1)
    for (int t = 0; t < nt2; ++t) {
      const int p0 = t * kPackN, np = std::min(kPackN, npan2 - p0), ld = np * kPanel;
      const int c0 = p0 * kPanel, nc = std::min(D, (p0 + np) * kPanel) - c0;
      for (int i = 0; i < S; ++i) std::fill(y + (size_t)i * D + c0, y + (size_t)i * D + c0 + nc, 0.f);
      for (const Job& j : jobs) {
        const bool shared = j.rw.empty();
        buf.resize((size_t)j.M * ld);
        packed_panels(j.as.data(), j.M, *j.w2, p0, np, buf.data());
        for (int i = 0; i < j.M; ++i) {
          float* dst = y + (size_t)j.rows[i] * D + c0;
          const float* ri = &buf[(size_t)i * ld];
          if (shared)
            for (int q = 0; q < nc; ++q) dst[q] = dst[q] + ri[q];
          else
            for (int q = 0; q < nc; ++q) dst[q] += ri[q] * j.rw[i];
        }
      }
    }
  }
  prof_lap(P_EXPERTS, t0);  // routed and shared experts: one pair of parallel phases
}

}  // namespace cairn
